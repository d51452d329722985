"""The device kernels a training step runs, each against a reference: fla's Gated DeltaNet kernels,
xgrammar's bitmask and sampling under it, and TRL's chunked log-prob head."""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable

import torch

from emoji_rl.bench.shapes import QWEN3_5_4B, qwen_grammar, step_episodes
from emoji_rl.lm import models
from emoji_rl.selftest.core import (
    Config,
    Result,
    check,
    dtype_name,
    is_cuda,
    last_line,
    need_cuda,
    need_module,
    relative_error,
    timed_ms,
    verdict,
)

# Qwen3.5-4B's Gated DeltaNet: 16 key heads and 32 value heads, each 128 wide (grouped value heads).
_HK, _HV = QWEN3_5_4B["linear_num_key_heads"], QWEN3_5_4B["linear_num_value_heads"]
_DK, _DV = QWEN3_5_4B["linear_key_head_dim"], QWEN3_5_4B["linear_value_head_dim"]
# bf16 tolerances on ||kernel - reference|| / ||reference||, the reference run in fp32 on the same
# bf16-rounded inputs, so only the kernel's own bf16 intermediates count. fla's tests of these kernels
# (tests/ops/test_gated_delta.py) allow, in fp16, 0.005 on the output and state, 0.008 on dq, dk and
# dv, 0.02 on dbeta and dg; bf16 keeps 3 bits fewer than fp16, and these bounds are twice those. Value
# heads grouped the wrong way err by 1.4 (tests/test_selftest.py).
FORWARD_TOLERANCE = 0.01
BACKWARD_TOLERANCE = 0.02
GATE_GRADIENT_TOLERANCE = 0.04
PREFILL_LENGTH = 300  # five chunks of 64 with a partial last one
LEFT_PAD = 45
DECODE_STEPS = 16


def delta_rule_inputs(batch: int, length: int, device: str, pad: int = 0) -> list[torch.Tensor]:
    """q, k, v (bf16), g (fp32, log decay <= 0), beta (bf16) as Qwen3.5's Gated DeltaNet passes them.

    Row 1 is left-padded by `pad`: the layer zeroes a padded position's hidden state, and its causal
    convolution has no bias and silu(0) = 0, so q, k and v are 0 there while g and beta are not."""
    bf16 = torch.bfloat16
    q = torch.randn(batch, length, _HK, _DK, device=device, dtype=bf16)
    k = torch.randn(batch, length, _HK, _DK, device=device, dtype=bf16)
    v = torch.randn(batch, length, _HV, _DV, device=device, dtype=bf16)
    g = torch.nn.functional.logsigmoid(torch.randn(batch, length, _HV, device=device))
    beta = torch.randn(batch, length, _HV, device=device, dtype=bf16).sigmoid()
    for x in (q, k, v):
        x[1:, :pad] = 0
    return [q, k, v, g, beta]


def _gated_delta_rule(name: str) -> tuple[Callable, Callable]:
    """(fla's kernel, transformers' torch reference) for `chunk` or `fused_recurrent`."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    err = models.import_error("fla")
    if err is not None:
        raise RuntimeError(
            f"flash-linear-attention does not import ({last_line(err)}): Qwen3.5's linear attention would "
            "run transformers' torch reference; install the gpu extra (docs/gpu/SELFTEST.md)"
        )
    kernel = getattr(importlib.import_module("fla.ops.gated_delta_rule"), f"{name}_gated_delta_rule")
    # The module-level names are wrappers that may already dispatch to fla: unwrap to the torch code.
    reference = inspect.unwrap(getattr(qwen, f"torch_{name.replace('fused_', '')}_gated_delta_rule"))
    return kernel, reference


def _delta_rule(function: Callable, q, k, v, g, beta, state=None):
    # As Qwen3_5GatedDeltaNet.forward calls either: l2-normalised q and k inside, the final state out.
    return function(
        q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )


@check("linear-attention-prefill")
def linear_attention_prefill(cfg: Config, runtime: models.Runtime) -> Result:
    """fla's chunk_gated_delta_rule, forward and backward, against transformers' torch reference, with
    a left-padded row that must equal the same row run alone."""
    need_cuda(runtime)
    kernel, reference = _gated_delta_rule("chunk")
    torch.manual_seed(0)
    inputs = delta_rule_inputs(2, PREFILL_LENGTH, runtime.device, pad=LEFT_PAD)
    ours = [x.clone().requires_grad_() for x in inputs]
    theirs = [x.detach().float().requires_grad_() for x in inputs]
    out, state = _delta_rule(kernel, *ours)
    want_out, want_state = _delta_rule(reference, *theirs)
    grad = torch.randn_like(want_out)
    out.backward(grad.to(out.dtype))
    want_out.backward(grad)
    with torch.no_grad():
        alone, _ = _delta_rule(kernel, *(x[1:, LEFT_PAD:] for x in inputs))
    errors = {
        "output": relative_error(out, want_out),
        "final state": relative_error(state, want_state),
        "left-padded row vs alone": relative_error(out[1:, LEFT_PAD:], alone),
    }
    grads = ("dq", "dk", "dv", "dg", "dbeta")
    errors |= {n: relative_error(a.grad, b.grad) for n, a, b in zip(grads, ours, theirs, strict=True)}
    tolerances = {k: BACKWARD_TOLERANCE if k.startswith("d") else FORWARD_TOLERANCE for k in errors}
    tolerances |= {"dg": GATE_GRADIENT_TOLERANCE, "dbeta": GATE_GRADIENT_TOLERANCE}
    shape = f"2 x {PREFILL_LENGTH} tokens ({LEFT_PAD} left padding), {_HK}/{_HV} heads of {_DK}"
    return verdict(errors, tolerances, shape)


@check("linear-attention-decode")
def linear_attention_decode(cfg: Config, runtime: models.Runtime) -> Result:
    """fla's fused_recurrent_gated_delta_rule for DECODE_STEPS steps against the torch reference,
    both from the same prefill state after a cache reorder (rows swapped, as when a batch is
    reordered between turns)."""
    need_cuda(runtime)
    chunk, _ = _gated_delta_rule("chunk")
    kernel, reference = _gated_delta_rule("fused_recurrent")
    torch.manual_seed(1)
    with torch.no_grad():
        _, state = _delta_rule(chunk, *delta_rule_inputs(2, PREFILL_LENGTH, runtime.device, pad=LEFT_PAD))
        state = state.index_select(0, torch.tensor([1, 0], device=state.device))
        ours, theirs = state.clone(), state.float().clone()
        outs, want_outs = [], []
        for _ in range(DECODE_STEPS):
            step = delta_rule_inputs(2, 1, runtime.device)
            out, ours = _delta_rule(kernel, *step, state=ours)
            want, theirs = _delta_rule(reference, *(x.float() for x in step), state=theirs)
            outs.append(out)
            want_outs.append(want)
    errors = {
        "outputs": relative_error(torch.cat(outs, 1), torch.cat(want_outs, 1)),
        "final state": relative_error(ours, theirs),
    }
    tolerances = dict.fromkeys(errors, FORWARD_TOLERANCE)
    return verdict(errors, tolerances, f"{DECODE_STEPS} steps x 2 rows after a reorder")


def _grammar_rows(rows: int) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """`rows` random emoji messages in Qwen3.5's tokens (end of turn included), and xgrammar's
    bitmask before each of their tokens, one row per token: the grammar in every state it reaches."""
    from emoji_rl.emoji.constraint import replay_bitmask

    constraint = qwen_grammar()
    actions = [episode.turns[0].action_ids for episode in step_episodes(rows, turns=1)]
    return actions, torch.cat([replay_bitmask(constraint, action) for action in actions])


@check("grammar-bitmask")
def grammar_bitmask(cfg: Config, runtime: models.Runtime) -> Result:
    """The project's masking (mask_logits_to_support_, and EmojiLogitsProcessor step by step) against
    xgrammar's own apply_token_bitmask_inplace (its CUDA/Triton path on a GPU) on the same logits."""
    import xgrammar as xgr

    from emoji_rl.decode.logits import EmojiLogitsProcessor, mask_logits_to_support_

    constraint = qwen_grammar()
    actions, bitmask = _grammar_rows(32 if is_cuda(runtime) else 8)
    torch.manual_seed(2)
    logits = torch.randn(len(bitmask), constraint.vocab_size, device=runtime.device, dtype=runtime.dtype)
    ours, theirs = logits.clone(), logits.clone()
    device_bitmask = bitmask.to(runtime.device)
    constraint.support  # noqa: B018 - computed once, here, so that the timing below is of the masking
    ours_ms = timed_ms(runtime, lambda: mask_logits_to_support_(ours, bitmask, constraint.support))
    theirs_ms = timed_ms(runtime, lambda: xgr.apply_token_bitmask_inplace(theirs, device_bitmask))
    differ = int((ours != theirs).any(-1).sum())

    # The processor follows each row's matcher through the tokens it is fed: at step t the rows are
    # the t-th token of every message, and its mask must be the replayed one.
    steps = min(len(a) for a in actions)
    starts = torch.tensor([0, *(len(a) for a in actions[:-1])]).cumsum(0)
    ids = torch.tensor([[0, *a[:steps]] for a in actions], device=runtime.device)
    processor = EmojiLogitsProcessor(constraint)
    processor_differ = 0
    for t in range(steps):
        scores = logits[starts + t]
        got = processor(ids[:, : t + 1], scores.clone())
        want = scores.clone()
        xgr.apply_token_bitmask_inplace(want, device_bitmask[starts + t])
        processor_differ += int((got != want).any(-1).sum())
    figure = (
        f"{len(bitmask)} grammar states x {constraint.vocab_size:,} ids, {dtype_name(runtime.dtype)} on "
        f"{runtime.device}: {differ} rows differ from xgrammar's (ours {ours_ms:.1f} ms, xgrammar "
        f"{theirs_ms:.1f} ms); EmojiLogitsProcessor {steps} steps x {len(actions)} rows: {processor_differ} differ"
    )
    return Result("FAIL" if differ or processor_differ else "PASS", figure)


@check("grammar-sampling")
def grammar_sampling(cfg: Config, runtime: models.Runtime) -> Result:
    """generate.sample_tokens on masked logits at the real vocabulary width and the runtime's dtype,
    counting draws of a masked id (there must be none)."""
    from emoji_rl.decode.generate import sample_tokens
    from emoji_rl.decode.logits import mask_logits_to_support_
    from emoji_rl.emoji.constraint import unpack_bitmask

    constraint = qwen_grammar()
    # ~40 grammar states a message. A GPU call takes ~1,000 rows (an int64 [rows, V] sum is 2 GB);
    # a CPU sums ~35M logits a second whatever the height, so fewer rows make more calls.
    _, bitmask = _grammar_rows(24 if is_cuda(runtime) else 4)
    torch.manual_seed(3)
    # Spread logits, so some allowed ids hold almost all the mass and others under 2^-52 of it.
    scores = torch.randn(len(bitmask), constraint.vocab_size, device=runtime.device, dtype=runtime.dtype) * 8
    scores = mask_logits_to_support_(scores, bitmask, constraint.support)
    allowed = unpack_bitmask(bitmask, constraint.vocab_size).to(runtime.device)
    draws = masked = 0
    deadline = time.perf_counter() + cfg.sampling_seconds
    while draws < cfg.sampling_draws and time.perf_counter() < deadline:
        ids, _ = sample_tokens(scores, 1.0)
        masked += int((~allowed.gather(1, ids[:, None])).sum())
        draws += len(ids)
    cut = "" if draws >= cfg.sampling_draws else f" (of {cfg.sampling_draws:,}: --sampling_seconds)"
    figure = f"{draws:,} draws{cut} over {len(bitmask)} grammar states x {constraint.vocab_size:,}: {masked} masked"
    return Result("FAIL" if masked else "PASS", figure)


# What SFTTrainer (TRL 1.16) asks of the fused head it puts on the model (`add_fused_lm_head` in its
# __init__); `add_fused_lm_head` then calls ChunkedLogProbFunction with the tile width below.
SFT_HEAD_OUTPUTS = ("log_probs", "entropy", "is_top1")
# Tokens through the head: a micro-batch's answer tokens on CUDA (the fp32 reference's [N, V] logits
# and their copies ~8 GB there); a CPU checks the same code paths at a narrow hidden size.
HEAD_TOKENS = {"cuda": 2048, "cpu": 64}
CPU_HEAD_HIDDEN = 256
# bf16 rounds each logit (and, in the backward, each logit gradient) to 2^-9 of itself: relative errors
# of a few 1e-3; the bounds are those of the kernels above, 0.01 forward and 0.02 on the gradient.
HEAD_TOLERANCES = {"log-probs": 0.01, "entropy": 0.01, "d hidden": 0.02, "grpo head log-probs": 0.01}


def fp32_head(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(log-probs of `targets`, entropy) from the whole [N, V] logits in fp32: the reference."""
    logp = (hidden.float() @ weight.float().T).log_softmax(-1)
    return logp.gather(-1, targets[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)


@check("chunked-head")
def chunked_head(cfg: Config, runtime: models.Runtime) -> Result:
    """TRL's ChunkedLogProbFunction, as SFTTrainer's fused LM head calls it (log-probs, entropy, and
    the gradient into the hidden states, the LM head frozen under LoRA), and GRPO's own
    `head_token_logprobs`, against an fp32 log-softmax over the real vocabulary."""
    need_module("trl", "TRL's head")
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction, _use_triton
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    from emoji_rl.rl.grpo import head_token_logprobs

    cuda = is_cuda(runtime)
    width, vocab = QWEN3_5_4B["hidden_size"] if cuda else CPU_HEAD_HIDDEN, QWEN3_5_4B["vocab_size"]
    tokens = HEAD_TOKENS["cuda" if cuda else "cpu"]
    torch.manual_seed(4)
    hidden = torch.randn(tokens, width, device=runtime.device).to(runtime.dtype)
    # Logits spread as a trained model's (std ~3): bf16 rounds large logits by more.
    weight = (torch.randn(vocab, width, device=runtime.device) * 3 / width**0.5).to(runtime.dtype)
    targets = torch.randint(vocab, (tokens,), device=runtime.device)
    ours = hidden.clone().requires_grad_()
    theirs = hidden.detach().float().requires_grad_()
    # The Trainer runs bf16 weights under accelerate's bf16 autocast, which sets the head's compute dtype.
    bf16 = runtime.dtype == torch.bfloat16
    with torch.autocast(runtime.device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
        logp, entropy, *_ = ChunkedLogProbFunction.apply(
            ours, weight, None, targets, 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, SFT_HEAD_OUTPUTS
        )
    with torch.no_grad():
        grpo_logp = head_token_logprobs(hidden, lambda h: h @ weight.T, targets)
    want_logp, want_entropy = fp32_head(theirs, weight, targets)
    grad = torch.randn(tokens, device=runtime.device)
    (logp * grad).sum().backward()
    (want_logp * grad).sum().backward()
    errors = {
        "log-probs": relative_error(logp, want_logp),
        "entropy": relative_error(entropy, want_entropy),
        "d hidden": relative_error(ours.grad, theirs.grad),
        "grpo head log-probs": relative_error(grpo_logp, want_logp),
    }
    path = "Triton" if _use_triton(hidden.device) else "torch"
    shape = (
        f"{tokens} tokens x hidden {width} x vocab {vocab:,}, {dtype_name(runtime.dtype)}, TRL's {path} tiles"
    )
    return verdict(errors, HEAD_TOLERANCES, shape)
