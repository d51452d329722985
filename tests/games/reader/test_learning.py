"""The reader checked by learning: a few GRPO steps on one message raise the similarity of the embedded
SmolLM2's sampled guesses, measured before and after on the same seeds."""

import asyncio

import pytest
import torch
from tests.games.scripted import ScriptedSender

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.sampler import HFSampler
from emoji_rl.games.reader.game import ReaderBuilder, ReaderRules
from emoji_rl.games.reader.partner import Partner
from emoji_rl.io.metrics import read_metrics
from emoji_rl.lm import models
from emoji_rl.play.loop import play
from emoji_rl.play.similarity import GuessScorer, Similarity
from emoji_rl.play.types import GameSetup
from emoji_rl.rl import train as grpo_train
from emoji_rl.rl.policy import build_policy
from emoji_rl.rl.train_config import grpo_config

pytestmark = pytest.mark.slow

RECORD = {"id": "m0", "target": "Let's get pizza and watch a movie tonight", "emoji": "🍕 🎬"}


def _mean_similarity(builder, sampler, n=24, seed=123):
    torch.manual_seed(seed)
    episodes = asyncio.run(play([builder(RECORD) for _ in range(n)], sampler))
    return sum(e.turns[-1].result.metrics["similarity"] for e in episodes) / n


def test_grpo_raises_the_readers_similarity(tmp_path, embedder):
    cfg = grpo_config(
        game="reader",
        output_dir=str(tmp_path / "run"),
        batch_size=1,
        group_size=8,
        max_turns=1,
        max_new_tokens=24,
        learning_rate=5e-4,
        beta=0.0,
        lora_r=8,
        lora_alpha=16,
        max_steps=6,
        save_steps=100,
        per_device_train_batch_size=8,
    )
    torch.manual_seed(0)  # the fresh adapter's initialization
    tokenizer = models.load_tokenizer(cfg.model)
    policy = build_policy(cfg.model, models.pick_runtime("cpu"), None, None, cfg.lora_r, cfg.lora_alpha)
    sampler = HFSampler(policy, tokenizer, Decoding("none", 1.0, cfg.max_new_tokens, 32))
    # One turn: the sender is never asked, so a scripted one that knows nothing will do.
    builder = ReaderBuilder(
        tokenizer, Partner(ScriptedSender([])), GuessScorer(Similarity(embedder)), ReaderRules(max_turns=1)
    )
    before = _mean_similarity(builder, sampler)
    grpo_train.train(cfg, policy, tokenizer, GameSetup(builder, [RECORD], "none", "reader"), sampler)
    after = _mean_similarity(builder, sampler)
    print(f"similarity of sampled guesses: before {before:.3f}, after {after:.3f}")
    # Measured: 0.281 -> 0.407, the group mean 0.22 at step 1 and 0.54 at step 6 (lr 2e-3 instead
    # collapsed the groups to one guess by step 4, and a worse one).
    assert after > before + 0.08
    assert [m["step"] for m in read_metrics(cfg.output_dir)] == list(range(1, 7))
