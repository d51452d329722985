"""The `grpo_overlap` rows of `make bench` (issue #45): a GRPO step with its rollouts one version ahead
of the update (`max_off_policy_steps` K = 1, docs/DESIGN.md §7) against lockstep (K = 0), both
measured in one run on the real vLLM engine built for the CPU (`make setup-vllm-engine`).

Pinning. On 2 cores an overlap is only real if the two sides do not share a core: the policy server
(the API process and its engine, every process `launch/serve_policy.sh` starts) runs under
`taskset -c <first core>` with one OpenMP thread, and the trainer (this process: every thread it
has, its rollout thread and torch with one thread) is pinned to the second core with
`os.sched_setaffinity` while the runs last, then set back. Unpinned, both would spread over both
cores: lockstep would use both for each side in turn, and K = 1 would only make them compete.

The shape (`BALANCED`) is chosen so that in lockstep the rollouts (sampled on core 0) and the update
(on core 1) each take 40-60% of the step: then overlapping them can halve the step, and the goals
mean something. K = 1 should take at most 0.65x the lockstep step and at most 1.15x the slower of
the two sides measured in lockstep (not their sum). The game is one turn on a fixed prompt, its
reward a hash of the emoji (no judge: what is timed is sampling against updating). Then the same
ratio for the engine test's own shape (tests/vllm_engine/test_grpo.py: the retrieval game, B=2,
G=4, the judge served by the same engine), reported whatever it is: its rollouts (sampling, then the
judge on the same core) outweigh its update, and its learning rate (5e-3) moves the policy, so the
two runs do not time the same messages. The toy runs learn at 1e-6: their messages, and so both
sides' work, stay as the starting adapter makes them.

Each run takes `STEPS` steps; the first `WARMUP` are left out (the first step of K = 1 has nothing
to overlap with, and both pay first calls), the medians of the rest are compared.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from emoji_rl.bench.engine import ENGINE_VENV, ROOT, Server, engine_env, start_server
from emoji_rl.bench.row import Row
from emoji_rl.bench.step_times import StepTimes, describe, overlap_ratios, step_times
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.constraint import compile_emoji_grammar
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.game.types import Game, GameSetup, StepResult
from emoji_rl.io.metrics import read_metrics
from emoji_rl.lm import models, template
from emoji_rl.rl import train as grpo_train
from emoji_rl.rl.policy import build_policy, checkpoint_layers
from emoji_rl.rl.setup import build_sampler
from emoji_rl.rl.train_config import grpo_config

KEY_ENV = "EMOJI_RL_BENCH_ENGINE_KEY"
MAX_LORA_RANK = 16
MAX_MODEL_LEN = 1024
# As tests/vllm_engine: the CPU engine's 128-token blocks are longer than a one-turn prompt.
BLOCK_SIZE = 32
STEPS = 6
SEED = 0
TARGETS = (
    "Let's grab pizza tonight",
    "I missed the train again",
    "Happy birthday, have fun",
    "It's snowing, stay warm",
)
# The same four messages told at length: a longer prompt costs the update (every token is trained
# through) far more than the rollouts (the server reads a group's shared prompt once).
LONG_TARGETS = (
    "Let's grab pizza tonight after work, the new place by the station with the wood oven; I'll book a "
    "table for four at eight, bring your sister if she is free, and we can walk to the cinema after",
    "I missed the train again this morning because the bus was late and then the ticket machine broke, "
    "so I will be at the office an hour late; please start the meeting without me and keep my notes",
    "Happy birthday, have fun at the party tonight! I am sorry I cannot be there, I am stuck at my "
    "parents' farm with no car, but I baked you a chocolate cake and I will bring it over on Sunday",
    "It's snowing, stay warm: the roads are closed up the mountain, the schools are shut until "
    "Thursday, and the power may go out tonight, so fill the bath, charge your phone and find candles",
)


@dataclass(frozen=True)
class Shape:
    """What sets the two sides' work: prompts x group size episodes, each up to `max_new_tokens`
    tokens of up to `max_emoji` emoji on a short or a long message (`long_targets`), trained through
    a LoRA adapter of rank `lora_r`, with a KL weight `beta` to the base model (one more forward
    pass) and `gradient_checkpointing` (one more forward pass in the backward)."""

    batch_size: int
    group_size: int
    max_new_tokens: int
    max_emoji: int
    lora_r: int
    beta: float = 0.0
    gradient_checkpointing: bool = False
    long_targets: bool = False

    def describe(self) -> str:
        return (
            f"B={self.batch_size} G={self.group_size} max_new_tokens={self.max_new_tokens} "
            f"max_emoji={self.max_emoji} r={self.lora_r} beta={self.beta:g}"
            + (" gradient checkpointing" if self.gradient_checkpointing else "")
            + (" long targets" if self.long_targets else " short targets")
        )


# Measured here (2 cores, pinned as above): rollouts 46%, update 53% of the lockstep step. The
# reference pass (beta > 0) and activation checkpointing are the gpu profile's KL and Wordle's memory
# saver, here to give the update as much work as the engine's sampling on its core.
BALANCED = Shape(
    batch_size=1,
    group_size=16,
    max_new_tokens=24,
    max_emoji=6,
    lora_r=8,
    beta=0.01,
    gradient_checkpointing=True,
)


# --- pinning ----------------------------------------------------------------------------------------


def two_cores() -> tuple[int, int] | None:
    """The first two cores this process may run on (the engine's, the trainer's); None with fewer."""
    allowed = sorted(os.sched_getaffinity(0))
    return (allowed[0], allowed[1]) if len(allowed) >= 2 else None


@contextlib.contextmanager
def pinned(core: int) -> Iterator[None]:
    """Every thread of this process on `core`, and torch on one thread, until the block ends. Threads
    started inside inherit it (the rollout thread). Linux only: sched_setaffinity(0) pins the calling
    thread alone, so each thread listed in /proc/self/task is pinned."""
    tasks = [int(t) for t in os.listdir("/proc/self/task")]
    before = {}
    for tid in tasks:
        with contextlib.suppress(ProcessLookupError):
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, {core})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for tid, cpus in before.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus)


# --- the policy server ------------------------------------------------------------------------------


@contextlib.contextmanager
def policy_server(core: int, log: Path) -> Iterator[Server]:
    """`launch/serve_policy.sh` on the CPU engine pinned to `core` (`taskset`, one OpenMP thread),
    serving SmolLM2 as `policy` and as `judge`, with a key (in `KEY_ENV` here while it runs); stopped
    when the block ends, however it ends."""
    key = "bench-engine-key"
    env = engine_env(
        OMP_NUM_THREADS="1",
        POLICY_MAX_LORA_RANK=str(MAX_LORA_RANK),
        POLICY_MAX_MODEL_LEN=str(MAX_MODEL_LEN),
        POLICY_API_KEY=key,
        MAX_OFF_POLICY_STEPS="1",
    )
    args = ("--served-model-name", "policy", "judge", "--block-size", str(BLOCK_SIZE))
    start = time.monotonic()
    server = start_server("serve_policy.sh", log, env, *args, prefix=("taskset", "-c", str(core)))
    print(f"  policy server up in {time.monotonic() - start:.0f} s (core {core})", flush=True)
    previous = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = key
    try:
        yield server
    finally:
        server.stop()
        if previous is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = previous


# --- the runs ---------------------------------------------------------------------------------------


def hash_reward(emoji: Sequence[str]) -> float:
    """The toy game's reward: a hash of the message, in [0, 1). The episodes of a group differ, so
    their rewards spread and every group is trained on."""
    return zlib.crc32(" ".join(emoji).encode()) / 2**32


class HashEmojiGame(Game):
    """One emoji turn on `target`, rewarded by `hash_reward` (0 if invalid or cut off)."""

    def __init__(self, tokenizer, target: str, min_emoji: int, max_emoji: int) -> None:
        self.tokenizer, self.target = tokenizer, target
        self.min_emoji, self.max_emoji = min_emoji, max_emoji

    async def start(self) -> tuple[int, ...]:
        return tuple(template.chat_ids(self.tokenizer, sender_messages(self.target)))

    async def step(self, action_ids: tuple[int, ...]) -> StepResult:
        ended = bool(action_ids) and action_ids[-1] == template.stop_token_id(self.tokenizer)
        text = self.tokenizer.decode(action_ids[:-1] if ended else action_ids)
        parsed = parse_message(text, self.min_emoji, self.max_emoji)
        return StepResult(done=True, reward=hash_reward(parsed.emoji) if ended and parsed.ok else 0.0)


def _toy_run(server: Server, out: Path, shape: Shape, max_off_policy_steps: int, steps: int) -> list[dict]:
    """`steps` GRPO steps of the hash game with `engine vllm` on `server`; its metrics."""
    cfg = grpo_config(
        output_dir=str(out),
        engine="vllm",
        vllm_url=server.url,
        vllm_api_key_env=KEY_ENV,
        max_off_policy_steps=max_off_policy_steps,
        batch_size=shape.batch_size,
        group_size=shape.group_size,
        max_new_tokens=shape.max_new_tokens,
        max_emoji=shape.max_emoji,
        lora_r=shape.lora_r,
        lora_alpha=2 * shape.lora_r,
        # Small enough that the policy, so the messages' lengths and the work of both sides, stay as
        # they started: the two runs must time the same work, not two learning curves.
        learning_rate=1e-6,
        beta=shape.beta,
        gradient_checkpointing=shape.gradient_checkpointing,
        max_steps=steps,
        save_steps=steps,
        per_device_train_batch_size=8,
        seed=SEED,
    )
    torch.manual_seed(cfg.seed)  # the fresh LoRA adapter's initialization draws from it
    random.seed(cfg.seed)
    tokenizer = models.load_tokenizer(cfg.model)
    reference = cfg.reference if cfg.beta > 0 else None
    policy = build_policy(cfg.model, models.pick_runtime("cpu"), None, reference, cfg.lora_r, cfg.lora_alpha)
    if cfg.gradient_checkpointing:
        checkpoint_layers(policy)
    width = policy.get_output_embeddings().weight.shape[0]
    constraint = compile_emoji_grammar(tokenizer, cfg.min_emoji, cfg.max_emoji, vocab_size=width)
    targets = LONG_TARGETS if shape.long_targets else TARGETS
    records = [{"id": f"t{i}", "target": t} for i, t in enumerate(targets)]
    game = GameSetup(
        lambda r: HashEmojiGame(tokenizer, r["target"], cfg.min_emoji, cfg.max_emoji),
        records,
        constraint,
        "hash of the emoji",
    )
    sampler, sync = build_sampler(cfg, policy, tokenizer, "grammar")
    grpo_train.train(cfg, policy, tokenizer, game, sampler, sync)
    return read_metrics(out)


def _engine_test_run(server: Server, out: Path, max_off_policy_steps: int, steps: int) -> list[dict]:
    """tests/vllm_engine/test_grpo.py's run (the retrieval game, the judge on the same server) for
    `steps` steps; its metrics."""
    cfg = grpo_config(
        train_data=str(ROOT / "data" / "samples" / "rl_eval.jsonl"),
        output_dir=str(out),
        batch_size=2,
        group_size=4,
        max_turns=1,
        lora_r=8,
        learning_rate=5e-3,
        temperature=0.7,
        max_steps=steps,
        save_steps=steps,
        engine="vllm",
        vllm_url=server.url,
        vllm_api_key_env=KEY_ENV,
        max_off_policy_steps=max_off_policy_steps,
        judge="openai",
        judge_url=server.url,
        judge_model="judge",
        judge_api_key_env=KEY_ENV,
        judge_view="gloss",
        judge_temperature=0.0,
        seed=SEED,
    )
    grpo_train.main(cfg)
    return read_metrics(out)


def measure_toy(server: Server, tmp: Path, shape: Shape, steps: int = STEPS) -> tuple[StepTimes, StepTimes]:
    """Lockstep's and K = 1's step times of the hash game at `shape`, printed."""
    times = []
    for k in (0, 1):
        out = Path(tempfile.mkdtemp(prefix=f"toy-k{k}-", dir=tmp)) / "run"
        metrics = _toy_run(server, out, shape, k, steps)
        times.append(step_times(metrics))
        print(describe(f"K={k}", times[-1]), flush=True)
    return times[0], times[1]


def bench_overlap(shape: Shape = BALANCED, steps: int = STEPS, engine_test: bool = True) -> list[Row]:
    """K = 1 against lockstep, the engine on one core and the trainer on the other; `engine_test`: the
    engine test's shape too."""
    if not (ENGINE_VENV / "bin" / "vllm").is_file():
        print(
            f"  skipped: {ENGINE_VENV} is missing (build vLLM's engine for the CPU: make setup-vllm-engine)"
        )
        return []
    cores = two_cores()
    if cores is None:
        print(f"  skipped: the overlap needs 2 cores (one per side), this process may use {os.cpu_count()}")
        return []
    engine_core, trainer_core = cores
    # Any other work on the two cores lands on one side more than the other. `nice` does not shield
    # the bench where the kernel shares the cores between sessions first (sched_autogroup_enabled).
    print(f"  load average before the runs: {os.getloadavg()[0]:.1f} (an idle machine reads about 0)")
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with policy_server(engine_core, tmp / "policy-server.log") as server, pinned(trainer_core):
            print(f"  engine on core {engine_core}, trainer on core {trainer_core}; {shape.describe()}")
            lockstep, ahead = measure_toy(server, tmp, shape, steps)
            if engine_test:
                print("  the engine test's shape: retrieval, B=2 G=4, judge on the same server")
                test_times = []
                for k in (0, 1):
                    metrics = _engine_test_run(server, tmp / f"engine-test-k{k}", k, steps)
                    test_times.append(step_times(metrics))
                    print(describe(f"K={k}", test_times[-1]), flush=True)
    print(f"  grpo_overlap took {time.monotonic() - start:.0f} s", flush=True)
    balance = "balanced" if lockstep.balanced() else "NOT balanced (40-60% each)"
    print(
        f"  lockstep split: rollout {lockstep.rollout_share:.0%}, update {lockstep.update_share:.0%} "
        f"of the step ({balance})"
    )
    vs_lockstep, vs_slower = overlap_ratios(lockstep, ahead)
    slower = max(lockstep.rollout, lockstep.update)
    rows = [
        Row(
            "grpo overlap: K=1 step / lockstep step",
            f"{ahead.step:.2f} s",
            f"{lockstep.step:.2f} s",
            vs_lockstep,
            "<= 0.65x",
            vs_lockstep <= 0.65,
        ),
        Row(
            "grpo overlap: K=1 step / max(rollout, update)",
            f"{ahead.step:.2f} s",
            f"{slower:.2f} s",
            vs_slower,
            "<= 1.15x",
            vs_slower <= 1.15,
        ),
    ]
    if engine_test:
        test_lockstep, test_ahead = test_times
        ratio, _ = overlap_ratios(test_lockstep, test_ahead)
        rows.append(
            Row(
                "grpo overlap, engine test's shape: K=1 / lockstep",
                f"{test_ahead.step:.2f} s",
                f"{test_lockstep.step:.2f} s",
                ratio,
                "report",
                None,
            )
        )
    return rows
