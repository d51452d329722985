"""The GRPO rows of `make bench` (issue #5, point 9), each measured side by side in one run on the
embedded SmolLM2:

- `bench_rollout_throughput`: episodes/s of the hf engine playing B x G = 16 retrieval games in one
  batch (the collector) vs the same games one at a time, both through `HFSampler` with the grammar.
  The judge is the lexicon judge (emoji names, no LLM), so sampling is what is timed, not judging.
- `bench_grpo_step_vs_trl` (`bench/grpo_vs_trl.py`): one step of our trainer vs one of TRL's.
- `bench_kl_reference_memory`: peak RSS of the same update steps with the KL reference (the starting
  adapter frozen beside the trained one, as the configs ship) vs beta = 0, each in a fresh process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from emoji_rl.bench.row import Row
from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.sampler import HFSampler
from emoji_rl.emoji.alphabet import ALPHABET
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.lm import models, template
from emoji_rl.play.loop import play
from emoji_rl.play.types import Episode, GameSetup, StepResult, Turn
from emoji_rl.rl import grpo
from emoji_rl.rl.batch import collate
from emoji_rl.rl.checkpoint import TrainState
from emoji_rl.rl.policy import build_policy
from emoji_rl.rl.rollout.collect import Baselines, PromptStream, collect
from emoji_rl.rl.train_config import grpo_config
from emoji_rl.rl.update import update

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedTokenizerBase

# Short prompts keep every measurement to seconds; four of them x G = 4 is the B x G = 16.
TARGETS = (
    "Let's grab pizza tonight",
    "I missed the train again",
    "Happy birthday, have fun",
    "It's snowing, stay warm",
)
GROUP_SIZE = 4
MAX_NEW_TOKENS = 24
# At most 4 emoji, so a turn fits in 24 tokens: a longer one would end the episode as a violation.
MAX_EMOJI = 4
LORA_R, LORA_ALPHA = 16, 32
MICRO_BATCH = 8  # episodes per forward/backward pass, our default and TRL's per-device batch
LEARNING_RATE = 1e-4


def target_records(prompts: int) -> list[dict[str, str]]:
    if not 1 <= prompts <= len(TARGETS):
        raise ValueError(f"prompts={prompts} must be between 1 and {len(TARGETS)} (the bench's TARGETS)")
    return [{"id": f"t{i}", "target": t} for i, t in enumerate(TARGETS[:prompts])]


def fresh_policy() -> PeftModel:
    torch.manual_seed(0)  # the fresh LoRA adapter's initialization draws from it
    return build_policy(models.SMOLLM2, models.pick_runtime("cpu"), None, None, LORA_R, LORA_ALPHA)


# --- episodes/s: batched vs one at a time ------------------------------------------------------------


def bench_rollout_throughput(
    prompts: int = len(TARGETS),
    group_size: int = GROUP_SIZE,
    max_turns: int = 2,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> list[Row]:
    """The same retrieval games (lexicon judge, `max_turns` turns as the cpu config) played as one
    batch by the collector vs one episode at a time through the same sampler code.

    On 2 CPU cores batching pays far less than on a GPU: a decode step took 49 ms at batch 1 and
    105-128 ms at batch 16 (~5 ms more a row), and prefill costs ~2 ms a token at any batch size.
    So the batch must not waste rows or tokens: each group's shared prompt is read once
    (`emoji_rl.decode.prefill`: 12.0 -> 9.1-9.6 s, 2.75x -> 2.95x), a row leaves the batch when it stops
    and a token is drawn with one uniform instead of `torch.multinomial`'s 49K exponentials
    (`emoji_rl.decode.generate.decode`: 3.8x), and turn 2 goes on from each row's KV cache of turn 1
    instead of reading the episode again: 4.19-4.62x in four runs on a quiet machine, once both
    paths are warmed up."""
    from emoji_rl.games.retrieval.game import RetrievalBuilder, RetrievalRules
    from emoji_rl.play.judge import LexiconJudge
    from emoji_rl.play.similarity import load_similarity

    tokenizer = models.load_tokenizer(models.SMOLLM2)
    policy = fresh_policy()
    rules = RetrievalRules(max_turns=max_turns, max_emoji=MAX_EMOJI)
    builder = RetrievalBuilder(tokenizer, LexiconJudge(), load_similarity(), rules)
    records = target_records(prompts)
    episodes = prompts * group_size

    def sampler(batch_size: int) -> HFSampler:
        decoding = Decoding(max_new_tokens=max_new_tokens, batch_size=batch_size, max_emoji=MAX_EMOJI)
        return HFSampler(policy, tokenizer, decoding)

    batched, single = sampler(episodes), sampler(1)

    def play_batched() -> tuple[float, int]:
        torch.manual_seed(0)
        rollouts = asyncio.run(
            collect(
                PromptStream(records, seed=0, state=TrainState()),
                GameSetup(builder, records, "none", "retrieval, lexicon judge"),
                batched,
                prompts,
                group_size,
                Baselines("group"),
            )
        )
        return rollouts.seconds, sum(len(e.turns) for g in rollouts.played for e in g.episodes)

    def play_one_at_a_time() -> tuple[float, int]:
        torch.manual_seed(0)
        start = time.perf_counter()
        played = [asyncio.run(play([builder(r)], single))[0] for r in records for _ in range(group_size)]
        return time.perf_counter() - start, sum(len(e.turns) for e in played)

    # Warm-up of both (grammar compile, first kernels and allocations at each batch size): the first
    # batched run took 0.7-1.6 s longer than the next.
    asyncio.run(play([builder(records[0])], single))
    play_batched()
    # Batched before and after, averaged: on a shared machine, load that drifts evenly cancels out.
    before, (single_s, turns_single), after = play_batched(), play_one_at_a_time(), play_batched()
    batched_s = (before[0] + after[0]) / 2
    print(
        f"  rollout: batched {episodes} episodes, {before[1]} and {after[1]} turns in {before[0]:.1f} and "
        f"{after[0]:.1f} s; one at a time {turns_single} turns in {single_s:.1f} s"
    )
    rate_batched, rate_single = episodes / batched_s, episodes / single_s
    ratio = rate_batched / rate_single
    return [
        Row(
            f"hf rollout ep/s, BxG={episodes}: batched / one at a time",
            f"{rate_batched:.2f} ep/s",
            f"{rate_single:.2f} ep/s",
            ratio,
            ">= 4x",
            ratio >= 4,
        )
    ]


# --- peak memory: KL reference vs none -----------------------------------------------------------------


def emoji_episodes(tokenizer: PreTrainedTokenizerBase, count: int, group_size: int) -> list[Episode]:
    """`count` one-turn episodes as if sampled: a prompt, 2-MAX_EMOJI alphabet emoji and end of turn,
    rewards varied within each group. The same tensors in every process that updates on them."""
    # One code point each (3 SmolLM2 tokens), so a turn is as long as a sampled one under the 24-token
    # budget; ZWJ sequences and skin tones take up to 27 tokens each.
    short = [e for e in ALPHABET if len(e) == 1]
    stop = template.stop_token_id(tokenizer)
    episodes = []
    for i in range(count):
        prompt = tuple(
            template.chat_ids(tokenizer, sender_messages(TARGETS[(i // group_size) % len(TARGETS)]))
        )
        emoji = " ".join(short[(97 * i + 13 * j) % len(short)] for j in range(2 + i % (MAX_EMOJI - 1)))
        action = (*tokenizer(emoji, add_special_tokens=False)["input_ids"], stop)
        result = StepResult(done=True, reward=float(i % group_size))
        episodes.append(Episode((Turn(prompt, action, (0.0,) * len(action), result),)))
    return episodes


def _peak_rss_mb() -> float:
    """This process's peak resident set (MB), from Linux's VmHWM. Not `ru_maxrss`: that one survives
    exec, so a child started from a large process reports the parent's size at fork."""
    status = Path("/proc/self/status")
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no VmHWM line in {status}: the memory row needs Linux")


def update_peak_rss(
    init_adapter: str, beta: float, episodes: int, group_size: int, steps: int
) -> tuple[float, float]:
    """Peak RSS (MB) once the policy is loaded, and after `steps` updates through the trainer's
    `update` on `emoji_episodes`; the reference is built only when beta > 0, as `train.main` does.
    Meant for a fresh process (`_in_fresh_process`): RSS peaks never go down."""
    from accelerate import Accelerator

    from emoji_rl.emoji.constraint import compile_emoji_grammar

    cfg = grpo_config(
        init_adapter=init_adapter,
        reference="init",
        beta=beta,
        group_size=group_size,
        max_new_tokens=MAX_NEW_TOKENS,
        max_emoji=MAX_EMOJI,
        per_device_train_batch_size=MICRO_BATCH,
    )
    tokenizer = models.load_tokenizer(cfg.model)
    policy = build_policy(
        cfg.model, models.pick_runtime("cpu"), init_adapter, cfg.reference if beta > 0 else None
    )
    width = policy.get_output_embeddings().weight.shape[0]
    constraint = compile_emoji_grammar(tokenizer, cfg.min_emoji, cfg.max_emoji, vocab_size=width)
    played = emoji_episodes(tokenizer, episodes, group_size)
    rewards_P_G = torch.tensor([e.reward for e in played]).view(-1, group_size)
    batch = collate(played, grpo.group_advantages(rewards_P_G).flatten(), tokenizer.pad_token_id, constraint)
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.learning_rate)
    model, optimizer = accelerator.prepare(policy, optimizer)
    loaded = _peak_rss_mb()
    for _ in range(steps):
        update(cfg.update_settings(), accelerator, model, optimizer, batch)
        optimizer.step()
    return loaded, _peak_rss_mb()


def _in_fresh_process(
    init_adapter: str, beta: float, episodes: int, group_size: int, steps: int
) -> tuple[float, float]:
    """`update_peak_rss` in a new interpreter: a peak never goes down, and this process has loaded
    other models already."""
    call = (
        "from emoji_rl.bench.grpo import update_peak_rss; "
        f"print(*update_peak_rss({init_adapter!r}, {beta!r}, {episodes}, {group_size}, {steps}))"
    )
    done = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the memory probe (beta={beta}) failed:\n{done.stderr[-3000:]}")
    loaded, peak = done.stdout.split()[-2:]
    return float(loaded), float(peak)


def bench_kl_reference_memory(
    episodes: int = len(TARGETS) * GROUP_SIZE,
    group_size: int = GROUP_SIZE,
    steps: int = 2,
    beta: float = 0.01,
) -> list[Row]:
    """Peak RSS of `steps` updates on the same B x G episodes, from a starting adapter, with the KL
    reference (that adapter again, frozen) vs beta = 0."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh_policy().save_pretrained(tmp)  # stands in for the SFT adapter
        with_kl = _in_fresh_process(tmp, beta, episodes, group_size, steps)
        without = _in_fresh_process(tmp, 0.0, episodes, group_size, steps)
    print(
        f"  kl memory: loaded {with_kl[0]:.0f} / {without[0]:.0f} MB, peak {with_kl[1]:.0f} / {without[1]:.0f} MB "
        f"(with / without the reference)"
    )
    ratio = with_kl[1] / without[1]
    return [
        Row(
            f"peak RSS, {steps} updates BxG={episodes}: KL ref / beta 0",
            f"{with_kl[1]:.0f} MB",
            f"{without[1]:.0f} MB",
            ratio,
            "<= 1.3x",
            ratio <= 1.3,
        )
    ]
