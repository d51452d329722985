"""How a test compares two orders of one float computation.

Two paths that compute the same thing in another order (a shared prefix against the full pass, the
grammar's support against the whole vocabulary, one micro-batch against the batch, several processes
against one) differ by rounding, and the rounding depends on the kernels PyTorch picks for the CPU at
hand (`ATEN_CPU_CAPABILITY`: default, avx2, avx512): an fp32 tolerance that passes on one machine
fails on the next. So such a test runs both paths in float64 and asserts `F64`, where rounding cannot
hide a wrong mask or a token off by one, and is marked `float_paths`, which `make test` runs again
under the capability below the one PyTorch picks for this CPU (tests/capabilities.py). Where a
library rounds to fp32 inside whatever the input (an oracle's loss, Qwen3.5's Gated DeltaNet), the
tolerance is that rounding's, worked out beside the check. A test that compares a run with itself (a
resume, a rerun, a recomputation) stays exact.
"""

from __future__ import annotations

import functools

import torch

F64 = {"atol": 1e-10, "rtol": 1e-10}
"""float64's epsilon is 2.2e-16. The deepest computation compared (SmolLM2: 30 layers, reductions
over 576 hidden units and 49,152 logits) grows a rounding difference by at most ~1e2 per layer's
reductions, to ~1e-12 of values of order 10: 1e-10 is two orders above that, and a shifted mask or
a wrong token moves a log-prob by 1e-3 or more, seven orders above."""

FP32_EPS = 2.0**-23
"""float32's epsilon, 1.2e-7."""


def float64(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in float64, in place, its Llama RMSNorms computing in float64 too. transformers' norm
    casts its input to fp32 (an upcast from bf16, a downcast from fp64) and takes the mean of squares
    in fp32, in an order that depends on the batch's shape and the threads: two paths would differ
    by fp32 rounding through every layer. Its formula is the same in float64: weight x x / rms(x)."""
    model.double()
    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":  # SmolLM2, and tests.tiny's Llama
            module.forward = functools.partial(_rms_norm, module)
    return model


def _rms_norm(norm: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    return norm.weight * hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)


# transformers' modules that compute in fp32 whatever their input's dtype: an upcast from bf16, a
# downcast from fp64 (`hidden_states.to(torch.float32)` in the RMSNorms, the Gated DeltaNet rule).
_FP32_INSIDE = ("RMSNorm", "RMSNormGated", "GatedDeltaNet")


def fp32_inside(model: torch.nn.Module, reference: torch.Tensor) -> dict[str, float]:
    """The tolerance of two float64 paths through `model` that round inside its fp32 modules in
    another order: Qwen3.5's Gated DeltaNet stepping one token at a time against its chunked pass,
    its norms around them. Each such module rounds to FP32_EPS relative, so the two differ by at most
    that per module crossed, of the largest value: the tiny Qwen3.5 of tests/tiny.py crosses 17,
    2e-6 of the largest log-prob, where a wrong mask or token moves one by 1e-3 or more."""
    count = sum(type(module).__name__.endswith(_FP32_INSIDE) for module in model.modules())
    return {"atol": count * FP32_EPS * float(reference.abs().max()), "rtol": 0.0}
