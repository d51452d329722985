"""GRPO checked by learning: a toy verifiable reward goes up; a run resumed after a crash repeats the
metrics, rollouts and game state of an uninterrupted one; the stage runs end to end on the retrieval
game with the lexicon judge."""

import asyncio
import json
import zlib

import pytest
import torch
from tests.trackers import assert_mlflow_keeps_every_name

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.sampler import HFSampler
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.io.metrics import read_metrics
from emoji_rl.lm import models, template
from emoji_rl.play.loop import play
from emoji_rl.play.types import Env, GameSetup, StepResult
from emoji_rl.rl import train as grpo_train
from emoji_rl.rl import trainer as grpo_trainer
from emoji_rl.rl.policy import build_policy
from emoji_rl.rl.train_config import grpo_config

pytestmark = pytest.mark.slow

UNCOMPARABLE = ("time/", "throughput/", "server/")
FAVORITE = "🌱"
PROMPT = "I love the sunny weather today"


def favorite_share(emoji):
    return emoji.count(FAVORITE) / len(emoji)


class FavoriteEmojiEnv(Env):
    """One turn; the reward is `score(emoji)`, by default the share of FAVORITE (0 if invalid)."""

    def __init__(self, tokenizer, max_emoji, score=favorite_share):
        self.tokenizer, self.max_emoji, self.score = tokenizer, max_emoji, score

    async def start(self):
        return tuple(template.chat_ids(self.tokenizer, sender_messages(PROMPT)))

    async def step(self, action_ids):
        ended = action_ids[-1] == template.stop_token_id(self.tokenizer)
        parsed = parse_message(
            self.tokenizer.decode(action_ids[:-1] if ended else action_ids), 2, self.max_emoji
        )
        share = self.score(parsed.emoji) if ended and parsed.ok else 0.0
        return StepResult(done=True, reward=share, metrics={"share": share})


def favorite_setup(tokenizer, records, score=favorite_share):
    return GameSetup(lambda r: FavoriteEmojiEnv(tokenizer, 4, score), records, "grammar", "favorite emoji")


def _toy_setup(tmp_path, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "run"),
        batch_size=1,
        group_size=8,
        max_emoji=4,
        max_new_tokens=16,
        learning_rate=2e-3,
        beta=0.0,
        lora_r=8,
        lora_alpha=16,
        max_steps=4,
        save_steps=100,
        per_device_train_batch_size=8,
        seed=0,
    )
    settings.update(overrides)
    cfg = grpo_config(**settings)
    torch.manual_seed(cfg.seed)  # the fresh LoRA adapter's initialization draws from it
    tokenizer = models.load_tokenizer(models.SMOLLM2)
    reference = cfg.reference if cfg.beta > 0 else None
    policy = build_policy(cfg.model, models.pick_runtime("cpu"), None, reference, cfg.lora_r, cfg.lora_alpha)
    decoding = Decoding(max_new_tokens=cfg.max_new_tokens, batch_size=32, max_emoji=cfg.max_emoji)
    sampler = HFSampler(policy, tokenizer, decoding)
    return cfg, tokenizer, policy, sampler


def _mean_reward(tokenizer, sampler, n=24, seed=123):
    torch.manual_seed(seed)
    episodes = asyncio.run(play([FavoriteEmojiEnv(tokenizer, 4) for _ in range(n)], sampler))
    return sum(e.reward for e in episodes) / n


def test_grpo_raises_a_verifiable_reward(tmp_path):
    cfg, tokenizer, policy, sampler = _toy_setup(tmp_path)
    before = _mean_reward(tokenizer, sampler)
    records = [{"id": "p0", "target": PROMPT}]
    grpo_train.train(cfg, policy, tokenizer, favorite_setup(tokenizer, records), sampler)
    after = _mean_reward(tokenizer, sampler)
    print(f"share of {FAVORITE}: before {before:.3f}, after {after:.3f}")
    assert after > before + 0.15
    metrics = read_metrics(cfg.output_dir)
    assert [m["step"] for m in metrics] == list(range(1, 5))
    assert {
        "reward/mean",
        "group/frac_zero_std",
        "optim/loss",
        "optim/clip_frac",
        "sampler/kl_vs_trainer",
    } <= set(metrics[0])
    # The sampler's log-probs and the trainer's masked log-probs describe one distribution.
    assert all(abs(m["sampler/kl_vs_trainer"]) < 1e-3 for m in metrics if m["optim/skipped"] == 0)


def _comparable(metrics):
    """Without what depends on the clock or on what the servers served before (their cache and load)."""
    return [{k: v for k, v in m.items() if not k.startswith(UNCOMPARABLE)} for m in metrics]


class Interrupted(Exception):
    """The process dying."""


class GamesBuilt:
    """Run state for the checkpoint to carry, as the Wordle curriculum is: how many games were built."""

    def __init__(self):
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _dies_saving_step_3(monkeypatch, run, *args, **kwargs):
    """`run(*args, **kwargs)`, whose process dies saving step 3's checkpoint, after logging step 3."""
    real_save = grpo_trainer.save_checkpoint

    def save_or_die(run_dir, state, *args, **kwargs):
        if state.step == 3:
            raise Interrupted
        real_save(run_dir, state, *args, **kwargs)

    with monkeypatch.context() as patch, pytest.raises(Interrupted):
        patch.setattr(grpo_trainer, "save_checkpoint", save_or_die)
        run(*args, **kwargs)


def test_resume_after_a_crash_repeats_the_uninterrupted_run(tmp_path, monkeypatch):
    common = dict(max_steps=3, save_steps=2, batch_size=1, group_size=4, beta=0.05, reference="base")
    records = [{"id": f"p{i}", "target": PROMPT} for i in range(3)]

    def run(name, **overrides):
        cfg, tokenizer, policy, sampler = _toy_setup(tmp_path / name, **{**common, **overrides})
        built = GamesBuilt()

        def game(record):
            built.count += 1
            return FavoriteEmojiEnv(tokenizer, 4)

        if cfg.resume:
            torch.manual_seed(999)  # resuming restores the RNG: this seed must not matter
        setup = GameSetup(game, records, "grammar", "favorite emoji", state=built)
        return grpo_train.train(cfg, policy, tokenizer, setup, sampler), built.count

    _, full_built = run("full")
    full = tmp_path / "full" / "run"

    # The first attempt dies after logging step 3, before its checkpoint: the last one is step 2's.
    _dies_saving_step_3(monkeypatch, run, "split")
    split = tmp_path / "split" / "run"
    assert [m["step"] for m in read_metrics(split)] == [1, 2, 3]
    assert (split / "checkpoints" / "latest").read_text() == "step-000002"

    state, resumed_built = run("split", resume=True)
    resumed = read_metrics(split)
    # Step 3's lines from the dead attempt are gone: each step once, as in the uninterrupted run.
    assert state.step == 3 and [m["step"] for m in resumed] == [1, 2, 3]
    assert _comparable(resumed) == _comparable(read_metrics(full))
    assert _read_jsonl(split / "rollouts.jsonl") == _read_jsonl(full / "rollouts.jsonl")
    # The game's state came back with the checkpoint (8 games by step 2), then went on: 3 steps x 4.
    assert resumed_built == full_built == 12


def _tracked(row):
    """A logged row's metrics, without the trackers' own bookkeeping, the clock and the episodes' table."""
    own = {"step", "_step", "_runtime", "_timestamp", "timestamp"}
    skip = ("time/", "throughput/", "episodes")
    return {k: v for k, v in row.items() if k not in own and not k.startswith(skip)}


def test_wandb_and_trackio_get_each_step_once_in_one_run_across_a_resume(tmp_path, monkeypatch):
    from tests.trackers import trackio_rows, wandb_runs

    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # never to be written anywhere
    common = dict(save_steps=2, batch_size=1, group_size=2, report_to=["tensorboard", "wandb", "trackio"])
    records = [{"id": f"p{i}", "target": PROMPT} for i in range(3)]

    def run(**overrides):
        cfg, tokenizer, policy, sampler = _toy_setup(tmp_path, **{**common, **overrides})
        setup = GameSetup(lambda r: FavoriteEmojiEnv(tokenizer, 4), records, "grammar", "favorite emoji")
        return grpo_train.train(cfg, policy, tokenizer, setup, sampler)

    # The first attempt logs steps 1-3 and dies saving step 3's checkpoint: the last one is step 2's.
    _dies_saving_step_3(monkeypatch, run, max_steps=3)
    run_dir = tmp_path / "run"
    tracker = json.loads((run_dir / "trackers.json").read_text())
    # Resumed for one step more: step 3 is redone, step 4 is new.
    assert run(max_steps=4, resume=True).step == 4
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]

    # wandb: one run id over both attempts, each step once, with metrics.jsonl's keys and values (the
    # redone step 3 stays the first attempt's, which the resume repeats).
    (first_id, first), (second_id, second) = wandb_runs(run_dir)
    assert first_id == second_id == tracker["id"]
    assert [r["_step"] for r in first + second] == [1, 2, 3, 4]
    assert [_tracked(r) for r in first + second] == [_tracked(m) for m in metrics]
    # trackio: one run, by the name trackers.json keeps, each step once.
    points = trackio_rows(tracker["project"], tracker["name"])
    rows = [r for r in points if "episodes" not in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [_tracked(r) for r in rows] == [_tracked(m) for m in metrics]
    # Each step's episodes as a table (log_completions): the rollouts.jsonl records of that step, read
    # back from wandb's table files and trackio's store.
    episodes = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    tables = {r["step"]: r["episodes"]["_value"] for r in points if "episodes" in r}
    assert sorted(tables) == [1, 2, 3, 4]
    for step, table in tables.items():
        assert [(t["target"], t["reward"]) for t in table] == [
            (e["target"], e["reward"]) for e in episodes if e["step"] == step
        ]
    files = sorted(run_dir.glob("wandb/offline-run-*/files/media/table/episodes_*.table.json"))
    assert sorted(int(f.name.split("_")[1]) for f in files) == [1, 2, 3, 4]
    # The key reaches neither the run directory (config, tracker run, wandb's files) nor checkpoints.
    written = [path for path in run_dir.rglob("*") if path.is_file()]
    assert written and not [path for path in written if b"k" * 40 in path.read_bytes()]


def test_vllm_engine_trains_through_versioned_adapters(tmp_path, monkeypatch):
    from tests.fakes.fake_lm import FakeLM
    from tests.fakes.vllm_server import FakeVLLMServer

    from emoji_rl.decode.vllm import VLLMSampler
    from emoji_rl.io.endpoint import Endpoint
    from emoji_rl.rl.rollout.vllm import AdapterSync

    cfg, tokenizer, policy, _ = _toy_setup(tmp_path, max_steps=2, group_size=4, engine="vllm")
    monkeypatch.setenv("EMOJI_RL_TEST_POLICY_KEY", "test-key")
    with FakeVLLMServer(FakeLM(tokenizer), logprobs_mode="processed_logprobs") as server:
        endpoint = Endpoint(server.url + "/v1", api_key_env="EMOJI_RL_TEST_POLICY_KEY", backoff_s=0.01)
        decoding = Decoding(max_new_tokens=16, max_emoji=4)
        sampler = VLLMSampler(endpoint, "policy", template.stop_token_id(tokenizer), decoding)
        sync = AdapterSync(sampler, cfg.output_dir, "policy", keep=2, session="5e5")
        records = [{"id": "p0", "target": PROMPT}]

        # The fake server's model is not the policy: any reward its samples vary in will do. A hash of
        # the message gives a group no spread only if all its samples are the same message (a parity of
        # the first emoji once left both steps without an update).
        def message_hash(emoji):
            return zlib.crc32("".join(emoji).encode()) / 2**32

        setup = favorite_setup(tokenizer, records, message_hash)
        state = grpo_train.train(cfg, policy, tokenizer, setup, sampler, weight_sync=sync)
        loads = [body["lora_name"] for body in server.bodies("/v1/load_lora_adapter")]
        completions = server.bodies("/v1/completions")
    assert state.step == 2
    # The adapter is published before the first rollout and after every step, updated or not, under a
    # new name: version v is always step v's. In lockstep, step 2 rolled out with step 1's.
    assert loads == ["policy-5e5-v0", "policy-5e5-v1", "policy-5e5-v2"]
    assert completions[-1]["model"] == "policy-5e5-v1"
    assert completions[0]["model"] == "policy-5e5-v0"
    assert all(body["structured_outputs"] == {"grammar": constraint_ebnf()} for body in completions)
    # One prompt per request, as token ids, each with a seed of its own.
    assert all(isinstance(t, int) for body in completions for t in body["prompt"])
    assert len({body["seed"] for body in completions}) == len(completions)


def constraint_ebnf():
    from emoji_rl.emoji.constraint import grammar_ebnf

    return grammar_ebnf(2, 4)


@pytest.mark.parametrize(
    ("game", "record", "held_out", "rates", "extra"),
    [
        (
            "retrieval",
            {"id": "t0", "target": "let's get pizza tonight"},
            ["the train is late", "happy birthday sis", "I lost my keys"],
            # eval-retrieval's compared rates; retrieval@1 among the 3 held-out targets, all there are
            ["success@0.5", "success@0.7", "retrieval@1/3"],
            ["--judge", "lexicon"],
        ),
        (
            "wordle",
            {"id": "w0", "answer": "crane"},
            ["slate", "pride"],
            ["win_rate"],  # eval-wordle's
            ["--max_new_tokens", "48"],
        ),
    ],
)
def test_grpo_stage_runs_one_step_from_the_command_line(
    tmp_path, game, record, held_out, rates, extra, capsys
):
    """One step, then the held-out evaluation, whose line holds the rates the game's eval stage
    compares."""
    from emoji_rl import cli

    data = tmp_path / "rl.jsonl"
    data.write_text(json.dumps(record) + "\n")
    field = next(k for k in record if k != "id")
    eval_data = tmp_path / "rl_eval.jsonl"
    eval_data.write_text(
        "".join(json.dumps({"id": f"e{i}", field: v}) + "\n" for i, v in enumerate(held_out))
    )
    out = tmp_path / "run"
    code = cli.main(
        [
            "grpo",
            "--game",
            game,
            "--train_data",
            str(data),
            "--output_dir",
            str(out),
            "--max_steps",
            "1",
            "--batch_size",
            "1",
            "--group_size",
            "2",
            "--max_turns",
            "1",
            "--lora_r",
            "4",
            "--save_steps",
            "1",
            "--eval_data",
            str(eval_data),
            "--eval_steps",
            "1",
            *extra,
        ]
    )
    assert code == 0, capsys.readouterr().err
    [metrics] = read_metrics(out)
    assert metrics["step"] == 1 and "reward/mean" in metrics and "time/rollout_s" in metrics
    held = {key: metrics[f"eval/{key}"] for key in rates}
    assert all(0.0 <= value <= 1.0 for value in held.values()), held
    assert metrics["eval/turns"] == 1.0 and "eval/reward/mean" in metrics
    assert_mlflow_keeps_every_name(out)
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert (out / "checkpoints" / "latest").read_text() == "step-000001"
    assert (out / "config.yaml").is_file() and (out / "rollouts.jsonl").is_file()


def test_the_held_out_evaluation_is_greedy_play_at_its_steps_and_a_resume_keeps_it(tmp_path):
    """eval_before_train and eval_steps 2: the step-0 and step-2 lines hold the held-out records' mean
    reward as the trained policy plays them greedily (played again here, by hand), and a resume does not
    log the step-0 evaluation again."""
    eval_data = tmp_path / "held_out.jsonl"
    eval_data.write_text("".join(json.dumps({"id": f"e{i}", "target": PROMPT}) + "\n" for i in range(2)))
    held = dict(eval_data=str(eval_data), eval_steps=2, eval_before_train=True, save_steps=2, max_steps=2)
    cfg, tokenizer, policy, sampler = _toy_setup(tmp_path, **held)
    records = [{"id": "p0", "target": PROMPT}]
    grpo_train.train(cfg, policy, tokenizer, favorite_setup(tokenizer, records), sampler)
    lines = read_metrics(tmp_path / "run")
    evaluated = {m["step"]: m["eval/reward/mean"] for m in lines if "eval/reward/mean" in m}
    assert sorted(evaluated) == [0, 2]
    assert all(m["eval/turns"] == 1.0 and m["time/eval_s"] > 0 for m in lines if "eval/reward/mean" in m)
    greedy = HFSampler(
        policy, tokenizer, Decoding(temperature=0.0, max_new_tokens=cfg.max_new_tokens, max_emoji=4)
    )
    episodes = asyncio.run(play([FavoriteEmojiEnv(tokenizer, 4) for _ in range(2)], greedy))
    assert evaluated[2] == pytest.approx(sum(e.reward for e in episodes) / 2)

    cfg, tokenizer, policy, sampler = _toy_setup(tmp_path, **{**held, "max_steps": 3}, resume=True)
    grpo_train.train(cfg, policy, tokenizer, favorite_setup(tokenizer, records), sampler)
    assert [m["step"] for m in read_metrics(tmp_path / "run")] == [0, 1, 2, 3]


def test_eval_steps_without_eval_data_is_named_before_anything_runs():
    with pytest.raises(ValueError, match="eval_steps and eval_before_train need eval_data"):
        grpo_config(eval_steps=5)
