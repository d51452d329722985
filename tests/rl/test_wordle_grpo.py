"""A short CPU GRPO run on Wordle with the embedded SmolLM2: it completes and logs every reward term."""

import pytest
import torch

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.sampler import HFSampler
from emoji_rl.games.wordle.reward import TERMS
from emoji_rl.io.metrics import read_metrics
from emoji_rl.lm import models
from emoji_rl.play import registry
from emoji_rl.play.spec import game_config, read_game_records
from emoji_rl.rl import train as grpo_train
from emoji_rl.rl.checkpoint import latest_checkpoint
from emoji_rl.rl.policy import build_policy
from emoji_rl.rl.train_config import grpo_config

pytestmark = pytest.mark.slow


def test_grpo_on_wordle_logs_every_reward_term(tmp_path):
    cfg = grpo_config(
        game="wordle",
        output_dir=str(tmp_path / "run"),
        batch_size=2,
        group_size=2,
        max_steps=1,
        max_turns=2,
        max_new_tokens=24,
        beta=0.0,
        lora_r=4,
        lora_alpha=8,
        save_steps=100,
        per_device_train_batch_size=4,
        learning_rate=1e-4,
    )
    torch.manual_seed(0)
    tokenizer = models.load_tokenizer(cfg.model)
    policy = build_policy(cfg.model, models.pick_runtime("cpu"), None, None, cfg.lora_r, cfg.lora_alpha)
    sampler = HFSampler(policy, tokenizer, Decoding("none", max_new_tokens=cfg.max_new_tokens, batch_size=8))
    records = tmp_path / "wordle.jsonl"
    records.write_text(
        "".join(f'{{"id": "wordle-{a}", "answer": "{a}"}}\n' for a in ("above", "crane", "speed"))
    )
    cfg.train_data = str(records)
    spec = registry.load("wordle")
    rules = game_config(spec, cfg)
    played = read_game_records(rules, "train_data", cfg.train_data, cfg)
    setup = spec.setup(rules, cfg.game_context(tokenizer, models.pick_runtime("cpu"), played))
    state = grpo_train.train(cfg, policy, tokenizer, setup, sampler)
    assert state.step == 1
    # The trainer fed the curriculum the step's episodes, and it travels with the checkpoint, so a
    # resumed run goes on in its phase.
    saved = torch.load(latest_checkpoint(tmp_path / "run") / "trainer_state.pt", weights_only=False)
    assert saved["game"] == setup.state.state_dict() and len(saved["game"]["recent"]) == 4
    metrics = read_metrics(cfg.output_dir)
    assert [m["step"] for m in metrics] == [1]
    for name in (*TERMS, "total"):
        assert all(f"reward/{name}/mean" in m for m in metrics), name
    assert {
        "game/won",
        "game/turns",
        "game/format_rate",
        "game/invalid_rate",
        "game/curriculum_phase",
    } <= set(metrics[0])
