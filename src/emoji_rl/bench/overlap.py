"""The `grpo_overlap` rows of `make bench` (issue #45): a GRPO step with its rollouts one version ahead
of the update (`max_off_policy_steps` K = 1, docs/DESIGN.md §7) against lockstep (K = 0), both
measured in one run on the real vLLM engine built for the CPU (`make setup-vllm-engine`).

Pinning. On 2 cores an overlap is only real if the two sides do not share a core: the policy server
(the API process and its engine, every process `launch/serve_policy.sh` starts) runs under
`taskset -c <first core>` with one OpenMP thread, and the trainer (this process: every thread it
has, its rollout thread and torch with one thread) is pinned to the second core with
`os.sched_setaffinity` while the runs last, then set back. Unpinned, both would spread over both
cores: lockstep would use both for each side in turn, and K = 1 would only make them compete.

The shape balances itself on the machine at hand, so that the rows mean the same on every CPU: in
lockstep the rollouts (sampled on core 0) and the update (on core 1) should each take 40-60% of the
step, for then overlapping them can halve the step and the goals mean something. Which share each
side takes depends on the CPU (its kernels, its clock, the engine's build), so two short lockstep
probes, with bare prompts and with `PROBE_WORDS` words of padding, measure how each side grows with
the prompt (the update trains through every prompt token; the rollouts read a group's shared
prompt once), and the runs use the padding at which the two meet. K = 1 should take at most 0.65x
the lockstep step and at most 1.15x the slower of the two sides measured in lockstep (not their
sum). The game is one turn on a fixed prompt, its reward a hash of the emoji (no judge: what is
timed is sampling against updating). Then the same ratio for the engine test's own shape
(tests/vllm_engine/test_grpo.py: the retrieval game, B=2, G=4, the judge served by the same engine),
reported whatever it is, with where its rollouts' time goes (`time/judge_s`, `time/similarity_s`).
Every run learns at rate 0: both sides do all their work, and the policy, so the messages sampled
and the work they make, stays the starting adapter's, the same in lockstep and K = 1.

Each run takes `STEPS` steps; the first `WARMUP` are left out (the first step of K = 1 has nothing
to overlap with, and both pay first calls), the medians of the rest are compared.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from emoji_rl.bench.engine import ENGINE_VENV, ROOT, Server, engine_env, start_server
from emoji_rl.bench.row import Row
from emoji_rl.bench.step_times import (
    WARMUP,
    StepTimes,
    balancing_padding,
    describe,
    overlap_ratios,
    step_times,
)
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.io.metrics import read_metrics
from emoji_rl.lm import models, template
from emoji_rl.play.types import Env, GameSetup, StepResult
from emoji_rl.rl import train as grpo_train
from emoji_rl.rl.engine import build_engine
from emoji_rl.rl.policy import build_policy, checkpoint_layers
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
# What pads a message: ordinary words, one or two tokens each.
PADDING = (
    "and then we walked along the river past the old mill where the children were feeding the ducks "
    "while their parents talked about the weather and the price of bread at the market on the square"
)
PROBE_WORDS = 200
# The padded prompt, the reply and the chat template stay inside MAX_MODEL_LEN.
MAX_PADDING_WORDS = 500
PROBE_STEPS = 4  # WARMUP steps left out, then two measured


@dataclass(frozen=True)
class Shape:
    """What sets the two sides' work: prompts x group size episodes, each up to `max_new_tokens`
    tokens of up to `max_emoji` emoji on a message padded with `padding` words, trained through a
    LoRA adapter of rank `lora_r`, with a KL weight `beta` to the base model (one more forward pass)
    and `gradient_checkpointing` (one more forward pass in the backward)."""

    batch_size: int
    group_size: int
    max_new_tokens: int
    max_emoji: int
    lora_r: int
    beta: float = 0.0
    gradient_checkpointing: bool = False
    padding: int = 0

    def describe(self) -> str:
        return (
            f"B={self.batch_size} G={self.group_size} max_new_tokens={self.max_new_tokens} "
            f"max_emoji={self.max_emoji} r={self.lora_r} beta={self.beta:g}"
            + (" gradient checkpointing" if self.gradient_checkpointing else "")
            + f" padding={self.padding} words"
        )

    def targets(self) -> list[str]:
        cycle = PADDING.split()
        words = [cycle[i % len(cycle)] for i in range(self.padding)]
        return [" ".join([target, *words]) for target in TARGETS]


# Unpadded, the update is the lighter side on the CPUs seen so far (2-core Xeons: the engine's
# sampling of 16 replies outweighs training through them), which leaves padding room to balance.
BASE = Shape(batch_size=1, group_size=16, max_new_tokens=24, max_emoji=6, lora_r=8)


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


class HashEmojiEnv(Env):
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
        learning_rate=0.0,  # the two runs time the same work, not two learning curves
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
    records = [{"id": f"t{i}", "target": t} for i, t in enumerate(shape.targets())]
    game = GameSetup(
        lambda r: HashEmojiEnv(tokenizer, r["target"], cfg.min_emoji, cfg.max_emoji),
        records,
        "grammar",
        "hash of the emoji",
    )
    engine = build_engine(cfg, policy, tokenizer, "grammar")
    grpo_train.train(cfg, policy, tokenizer, game, engine.sampler, engine.sync)
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
        learning_rate=0.0,  # the test's 5e-3 would have the two runs sample other messages
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


def measure_toy(server: Server, tmp: Path, shape: Shape, ks: Sequence[int], steps: int) -> list[StepTimes]:
    """The step times of the hash game at `shape` with each K of `ks`, printed."""
    times = []
    for k in ks:
        out = Path(tempfile.mkdtemp(prefix=f"toy-k{k}-", dir=tmp)) / "run"
        times.append(step_times(_toy_run(server, out, shape, k, steps)))
        print(describe(f"K={k}", times[-1]), flush=True)
    return times


def balanced(server: Server, tmp: Path, shape: Shape) -> Shape:
    """`shape` padded so that in lockstep its rollouts and update meet on this machine (module doc)."""
    print(f"  balancing: lockstep probes of {PROBE_STEPS} steps, padding 0 and {PROBE_WORDS} words")
    (bare,) = measure_toy(server, tmp, shape, (0,), PROBE_STEPS)
    (padded,) = measure_toy(server, tmp, replace(shape, padding=PROBE_WORDS), (0,), PROBE_STEPS)
    return replace(shape, padding=balancing_padding(bare, padded, PROBE_WORDS, MAX_PADDING_WORDS))


def _engine_test_services(metrics: Sequence[dict]) -> str:
    """Where the engine test's rollouts go besides sampling: the judge's and the similarity's medians."""
    kept = [m for m in metrics if m["step"] > WARMUP]
    return ", ".join(
        f"{key.removeprefix('time/')} {statistics.median(m.get(key, 0.0) for m in kept):.2f}"
        for key in ("time/judge_s", "time/similarity_s")
    )


def bench_overlap(shape: Shape = BASE, steps: int = STEPS, engine_test: bool = True) -> list[Row]:
    """K = 1 against lockstep at `shape` balanced here, the engine on one core and the trainer on the
    other; `engine_test`: the engine test's shape too."""
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
            print(f"  engine on core {engine_core}, trainer on core {trainer_core}")
            shape = balanced(server, tmp, shape)
            print(f"  the balanced shape: {shape.describe()}")
            lockstep, ahead = measure_toy(server, tmp, shape, (0, 1), steps)
            if engine_test:
                print("  the engine test's shape: retrieval, B=2 G=4, judge on the same server")
                test_times = []
                for k in (0, 1):
                    metrics = _engine_test_run(server, tmp / f"engine-test-k{k}", k, steps)
                    test_times.append(step_times(metrics))
                    print(describe(f"K={k}", test_times[-1]), flush=True)
                    print(f"    of the rollouts: {_engine_test_services(metrics)} s (medians)", flush=True)
    print(f"  grpo_overlap took {time.monotonic() - start:.0f} s", flush=True)
    split = "balanced" if lockstep.balanced() else "NOT balanced (40-60% each)"
    print(
        f"  lockstep split: rollout {lockstep.rollout_share:.0%}, update {lockstep.update_share:.0%} "
        f"of the step ({split})"
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
