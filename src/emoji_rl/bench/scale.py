"""`make bench-scale`: the gpu profile's GRPO step at Qwen3.5-4B's real shapes, measured on the CPU.

The gpu profile (configs/gpu/grpo.yaml) plays 32 prompts x 4 rollouts a step, up to 5 turns, and
updates in micro-batches of 8 episodes. Its model cannot be downloaded here, so the rows run what can
(`bench/shapes.py`): the real vocabulary and grammar, and the real class at 1 and 2 decoder layers
with random weights. Each row compares today's path with the one it replaced (or guards), side by
side in one run; memory rows run in a fresh process each, since a peak never goes down. CPU figures
are fp32 (a GPU's logits are bf16, half the first [N, V] copy); per-layer figures are the difference
between the two depths, and what they say for 32 layers is an extrapolation.

    python -m emoji_rl.bench.scale [--only NAME ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from emoji_rl.bench.row import Row, run_benchmarks
from emoji_rl.bench.shapes import (
    DECODE_ROWS,
    EPISODES,
    MICRO_BATCH,
    NARROW_QWEN3_5,
    QWEN3_5_4B,
    QWEN3_5_4B_LAYERS,
    TURNS,
    UNCONSTRAINED_TOKENS,
    cut_qwen3_5_4b,
    peak_rss_above_now,
    qwen_grammar,
    step_episodes,
)
from emoji_rl.lm.lora import DEFAULT_TARGETS
from emoji_rl.play.types import Episode

if TYPE_CHECKING:
    from emoji_rl.emoji.constraint import EmojiConstraint

# --- memory in a fresh process ------------------------------------------------------------------------


def collate_memory(path: str) -> dict[str, float]:
    """A step's episodes collated: today's masks over the grammar's support (`after`), or the
    full-width masks collate kept before (`before`)."""
    from emoji_rl.emoji.constraint import replay_masks
    from emoji_rl.rl.batch import collate

    episodes = step_episodes()
    constraint = qwen_grammar()
    constraint.support  # noqa: B018 (computed once per grammar, outside the measured work)
    if path == "after":
        work = lambda: collate(episodes, torch.zeros(len(episodes)), 0, constraint)  # noqa: E731
    else:
        work = lambda: [  # noqa: E731
            torch.cat([replay_masks(constraint, t.action_ids) for t in e.turns]) for e in episodes
        ]
    peak, seconds = peak_rss_above_now(work)
    tokens = sum(len(t.action_ids) for e in episodes for t in e.turns)
    return {"peak_mb": peak, "seconds": seconds, "tokens": tokens}


def _kl_step_peak(logprobs: Callable[[], torch.Tensor]) -> tuple[float, float]:
    """(peak RSS above now, MB; seconds) of `logprobs` for the policy (its graph kept) and the
    reference, then the backward of their KL, as `update` runs them."""
    from emoji_rl.rl import grpo

    def work() -> None:
        policy = logprobs()
        with torch.no_grad():
            reference = logprobs()
        grpo.k3_kl(policy, reference).sum().backward()

    return peak_rss_above_now(work)


def head_memory(path: str) -> dict[str, float]:
    """The part of a micro-batch's log-probs that the vocabulary's width decides: from the final
    hidden states of its sender tokens, the LM head and the log-probs under the grammar, for the
    policy (kept for its backward) and the reference, then the backward. Over the support (`after`),
    or over the whole vocabulary with full-width masks copied in, as before (`before`)."""
    from emoji_rl.emoji.constraint import replay_masks
    from emoji_rl.rl import grpo
    from emoji_rl.rl.batch import collate, support_columns

    constraint = qwen_grammar()
    episodes = step_episodes(MICRO_BATCH)
    batch = collate(episodes, torch.zeros(MICRO_BATCH), 0, constraint)
    targets = batch.input_ids_D_T[:, 1:][batch.mask_D_T]
    torch.manual_seed(0)
    weight = torch.randn(QWEN3_5_4B["vocab_size"], QWEN3_5_4B["hidden_size"]) / 50
    hidden = torch.randn(len(targets), QWEN3_5_4B["hidden_size"], requires_grad=True)
    if path == "after":
        rows, columns = weight[batch.support], support_columns(batch.support, targets)
        allowed = torch.cat(batch.allowed_N_S)
    else:
        rows, columns = weight, targets
        full_masks = [replay_masks(constraint, t.action_ids) for e in episodes for t in e.turns]

    def logprobs() -> torch.Tensor:
        masks = allowed if path == "after" else torch.cat(full_masks)  # the copy to the device
        logits = torch.nn.functional.linear(hidden, rows)
        return grpo.masked_token_logprobs(logits[None], masks[None], columns[None])[0]

    peak, seconds = _kl_step_peak(logprobs)
    return {"peak_mb": peak, "seconds": seconds, "tokens": len(targets)}


def unconstrained_head_memory(path: str) -> dict[str, float]:
    """The same for log-probs with no grammar (Wordle's), over the whole vocabulary at
    `UNCONSTRAINED_TOKENS` positions: a few hundred at a time, each chunk's logits recomputed in the
    backward pass (`after`), or one log-softmax over all of them (`before`)."""
    from emoji_rl.rl import grpo

    torch.manual_seed(0)
    head = torch.nn.Linear(QWEN3_5_4B["hidden_size"], QWEN3_5_4B["vocab_size"], bias=False).requires_grad_(
        False
    )
    hidden = torch.randn(UNCONSTRAINED_TOKENS, QWEN3_5_4B["hidden_size"], requires_grad=True)
    targets = torch.randint(QWEN3_5_4B["vocab_size"], (UNCONSTRAINED_TOKENS,))

    def logprobs() -> torch.Tensor:
        if path == "after":
            return grpo.head_token_logprobs(hidden, head, targets)
        return grpo.masked_token_logprobs(head(hidden)[None], None, targets[None])[0]

    peak, seconds = _kl_step_peak(logprobs)
    return {"peak_mb": peak, "seconds": seconds, "tokens": UNCONSTRAINED_TOKENS}


def layers_memory(layers: int) -> dict[str, float]:
    """`token_logprobs` of one micro-batch through the cut model, policy and reference, and the
    backward, as `update` runs them with the KL in the loss: at two depths, the difference is a layer."""
    from emoji_rl.rl import grpo
    from emoji_rl.rl.batch import collate, token_logprobs

    model = cut_qwen3_5_4b(layers)
    # As under LoRA: the base weights frozen (no [V, H] gradient for the tied head), and a graph
    # through every layer, whose activations the backward keeps.
    model.requires_grad_(False)
    model.enable_input_require_grads()
    batch = collate(step_episodes(MICRO_BATCH), torch.zeros(MICRO_BATCH), 0, qwen_grammar())

    def work() -> None:
        policy = token_logprobs(model, batch, 1.0)
        with torch.no_grad():
            reference = token_logprobs(model, batch, 1.0)
        grpo.k3_kl(policy, reference)[batch.mask_D_T].sum().backward()

    peak, seconds = peak_rss_above_now(work)
    return {"peak_mb": peak, "seconds": seconds, "tokens": int(batch.attention_D_T.sum())}


def _in_fresh_process(function: str, *args: object) -> dict[str, float]:
    call = f"import json; from emoji_rl.bench.scale import {function}; print(json.dumps({function}{args!r}))"
    done = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{function}{args!r} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


# --- rows ---------------------------------------------------------------------------------------------


def bench_collate() -> list[Row]:
    after, before = (_in_fresh_process("collate_memory", path) for path in ("after", "before"))
    print(
        f"  collate: {after['tokens']:.0f} sender tokens in {EPISODES} episodes x {TURNS} turns; "
        f"{after['seconds']:.1f} s / {before['seconds']:.1f} s (support / full width)"
    )
    return [
        Row(
            f"collate, a step ({EPISODES}x{TURNS} turns): host peak, support / full masks",
            f"{after['peak_mb']:.0f} MB",
            f"{before['peak_mb']:.0f} MB",
            after["peak_mb"] / before["peak_mb"],
            "< 512 MB",
            after["peak_mb"] < 512,
        )
    ]


def bench_logprobs() -> list[Row]:
    after, before = (_in_fresh_process("head_memory", path) for path in ("after", "before"))
    depths = [_in_fresh_process("layers_memory", layers) for layers in (1, 2)]
    per_layer = depths[1]["peak_mb"] - depths[0]["peak_mb"]
    print(
        f"  log-probs: {after['tokens']:.0f} sender tokens in a micro-batch of {MICRO_BATCH}, "
        f"{after['seconds']:.1f} s / {before['seconds']:.1f} s (support / whole vocabulary); a layer of "
        f"the cut model: {per_layer:.0f} MB ({depths[0]['tokens']:.0f} tokens, 2 layers - 1, "
        "transformers' torch reference Gated DeltaNet)"
    )
    print(sizing_table(per_layer, depths[0]["tokens"], after["peak_mb"], before["peak_mb"]))
    chunked, whole = (_in_fresh_process("unconstrained_head_memory", path) for path in ("after", "before"))
    print(
        f"  log-probs without a grammar (Wordle), {UNCONSTRAINED_TOKENS} tokens: {chunked['seconds']:.1f} s / "
        f"{whole['seconds']:.1f} s (chunked / whole); both grow with the tokens, the chunked one by the hidden states only"
    )
    return [
        Row(
            f"log-probs, micro-batch of {MICRO_BATCH}, policy + reference + backward: support / vocabulary",
            f"{after['peak_mb']:.0f} MB",
            f"{before['peak_mb']:.0f} MB",
            after["peak_mb"] / before["peak_mb"],
            "< 1024 MB",
            after["peak_mb"] < 1024,
        ),
        Row(
            f"log-probs without a grammar, {UNCONSTRAINED_TOKENS} tokens, the same: chunked / whole",
            f"{chunked['peak_mb']:.0f} MB",
            f"{whole['peak_mb']:.0f} MB",
            chunked["peak_mb"] / whole["peak_mb"],
            "< 1024 MB",
            chunked["peak_mb"] < 1024,
        ),
    ]


def _lora_parameters(model: torch.nn.Module, rank: int) -> int:
    return sum(
        rank * (module.in_features + module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in DEFAULT_TARGETS
    )


def counted_parameters(lora_r: int = 32) -> tuple[int, int]:
    """(Qwen3.5-4B's parameters, its LoRA's of rank `lora_r` on DEFAULT_TARGETS): counted on the real
    class at full depth, on the meta device (no memory)."""
    with torch.device("meta"):
        model = cut_qwen3_5_4b(QWEN3_5_4B_LAYERS)
    return sum(p.numel() for p in model.parameters()), _lora_parameters(model, lora_r)


def sizing_table(
    per_layer_mb: float, tokens: float, head_mb: float, full_head_mb: float, lora_r: int = 32
) -> str:
    """A trainer process of the gpu profile, part by part, in Markdown, each figure saying how it is
    known: parameters counted on the real class at full depth (on the meta device: no memory), the
    rest measured here (CPU, fp32) and scaled to bf16 and 32 layers, or estimated."""
    weights, lora = counted_parameters(lora_r)
    gb = 1024**3
    # bf16 on a GPU: half the CPU's fp32 bytes for a layer's activations; the log-probs stay fp32.
    layer_gb = per_layer_mb / 2 / 1024
    # With activation checkpointing a layer keeps its input (bf16) and one layer at a time is recomputed.
    checkpointed_gb = QWEN3_5_4B_LAYERS * tokens * QWEN3_5_4B["hidden_size"] * 2 / gb + layer_gb
    fixed_gb = (2 * weights + 16 * lora) / gb + head_mb / 1024
    rows = [
        ("weights, bf16", f"{2 * weights / gb:.1f} GB", f"{weights / 1e9:.2f}B parameters, counted"),
        (
            f"LoRA r={lora_r} ({len(DEFAULT_TARGETS)} projections) + AdamW, fp32",
            f"{16 * lora / gb:.2f} GB",
            f"{lora / 1e6:.0f}M parameters x (weight, gradient, 2 moments), counted",
        ),
        (
            f"log-probs of a micro-batch ({MICRO_BATCH} episodes), policy + reference, over the support",
            f"{head_mb / 1024:.2f} GB",
            f"measured (CPU); over the whole vocabulary it was {full_head_mb / 1024:.1f} GB",
        ),
        (
            f"activations, micro-batch of {MICRO_BATCH} ({tokens:.0f} tokens), no checkpointing",
            f"<= {QWEN3_5_4B_LAYERS * layer_gb:.0f} GB",
            f"{per_layer_mb:.0f} MB a layer measured (fp32, CPU, torch reference Gated DeltaNet: an upper "
            f"bound for fla's kernels), halved for bf16, x{QWEN3_5_4B_LAYERS}: extrapolated",
        ),
        (
            "the same with `gradient_checkpointing: true`",
            f"~{checkpointed_gb:.1f} GB",
            "each layer's bf16 input kept, one layer recomputed at a time: estimated",
        ),
        (
            "total, without / with checkpointing",
            f"{fixed_gb + QWEN3_5_4B_LAYERS * layer_gb:.0f} / {fixed_gb + checkpointed_gb:.0f} GB",
            "the rows above; add the CUDA context and allocator slack (a few GB)",
        ),
    ]
    lines = ["| trainer process, gpu profile | memory | how known |", "|---|---|---|"]
    lines += [f"| {part} | {size} | {how} |" for part, size, how in rows]
    return "\n".join(lines)


def _grammar_step_ms(
    constraint: EmojiConstraint, actions: list[tuple[int, ...]], read: Callable[[torch.Tensor], object]
) -> float:
    """Median ms of the grammar's host work in a decode step over `actions`, one matcher a row as
    `EmojiLogitsProcessor` keeps them: fill the bitmask, then `read` from it what goes to the device.
    The masking itself runs on the device and is left out."""
    import xgrammar as xgr

    matchers = [constraint.matcher() for _ in actions]
    bitmask = xgr.allocate_token_bitmask(len(actions), constraint.vocab_size)
    spent = []
    for step in range(min(map(len, actions))):
        start = time.perf_counter()
        for row, matcher in enumerate(matchers):
            matcher.fill_next_token_bitmask(bitmask, row)
        read(bitmask)
        spent.append(time.perf_counter() - start)
        for matcher, action in zip(matchers, actions, strict=True):
            matcher.accept_token(action[step])
    return 1000 * sorted(spent)[len(spent) // 2]


def bench_grammar_step() -> list[Row]:
    """The grammar's host work in a decode step at 128 rows: reading the bits of the grammar's
    support (`mask_logits_to_support_`) against finding the set bits of the whole bitmask
    (`mask_logits_`, which the processor used before)."""
    from emoji_rl.decode.logits import allowed_positions
    from emoji_rl.emoji.constraint import bits_at

    constraint = qwen_grammar()
    actions = [e.turns[0].action_ids for e in step_episodes(DECODE_ROWS, turns=1)]
    support, width = constraint.support, constraint.vocab_size
    after = _grammar_step_ms(constraint, actions, lambda bitmask: bits_at(bitmask, support))
    before = _grammar_step_ms(constraint, actions, lambda bitmask: allowed_positions(bitmask, width))
    print(
        f"  grammar: the median step of a decode at {DECODE_ROWS} rows; for scale, Qwen3.5-4B's decode "
        "step on a GPU is a few ms (~8 GB of bf16 weights read at ~3 TB/s: 2.7 ms, an estimate)"
    )
    return [
        Row(
            f"grammar's host work per decode step, {DECODE_ROWS} rows: support / whole bitmask",
            f"{after:.1f} ms",
            f"{before:.1f} ms",
            after / before,
            "< 3 ms",
            after < 3,
        )
    ]


def _episode_reads(episode: Episode, continued: bool) -> int:
    """Prefill tokens the model reads when it plays `episode`'s turns (its own replies, each as long
    as the episode's) through `generate`'s prefill and decode loop: every token it reads, less the
    decoding's one a sampled token."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from emoji_rl.decode.generate import decode
    from emoji_rl.decode.prefill import prefill_inputs

    # The real class, layer pattern and vocabulary at a small width: only the count matters here.
    config = Qwen3_5TextConfig(vocab_size=QWEN3_5_4B["vocab_size"], num_hidden_layers=4, **NARROW_QWEN3_5)
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config).eval()
    read = [0]
    model.register_forward_pre_hook(
        lambda _, args, kwargs: read.__setitem__(0, read[0] + kwargs["input_ids"].numel()), with_kwargs=True
    )
    prompt: tuple[int, ...] = ()
    cache = None
    for turn in episode.turns:
        prompt += turn.observation_ids
        inputs = prefill_inputs(model, [prompt], 0, [cache] if continued else None)
        [(tokens, _, cache)] = decode(model, inputs, None, 0.0, len(turn.action_ids), (), 0, continued)
        read[0] -= len(tokens) - 1
        prompt += tuple(tokens)
    return read[0]


def bench_turn_prefill() -> list[Row]:
    """Prefill tokens of a 5-turn episode, measured through the decode path on Qwen3.5's hybrid
    cache: each turn re-reading the whole episode (as before, when no cache went on) against going
    on from the row's kept cache."""
    [episode] = step_episodes(1)
    before, after = _episode_reads(episode, False), _episode_reads(episode, True)
    # Going on, a turn reads its observation and the previous reply's last token (sampled, not read).
    new = sum(len(t.observation_ids) for t in episode.turns) + len(episode.turns) - 1
    return [
        Row(
            f"prefill tokens, one {TURNS}-turn episode: continued / re-read",
            f"{after}",
            f"{before}",
            after / before,
            f"{new} (only the new)",
            after == new,
        )
    ]


BENCHMARKS: dict[str, Callable[[], list[Row]]] = {
    "collate": bench_collate,
    "logprobs": bench_logprobs,
    "grammar_step": bench_grammar_step,
    "turn_prefill": bench_turn_prefill,
}


def main(argv: list[str] | None = None) -> None:
    run_benchmarks(BENCHMARKS, "python -m emoji_rl.bench.scale", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
