"""The float64 model of tests/floats.py computes what transformers' model does, without its fp32 casts."""

import pytest
import torch
from tests.floats import F64, FP32_EPS, float64
from tests.tiny import tiny_llama


@pytest.mark.float_paths
def test_float64_keeps_the_llama_norms_formula_in_float64():
    model = tiny_llama()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fp32 = model(input_ids=ids).logits
        norm = model.model.norm
        hidden = torch.randn(3, 32, dtype=torch.float64)
        downcast = norm(hidden)  # transformers' own norm rounds a float64 input to fp32
        float64(model)
        assert model.model.norm.weight.dtype == torch.float64
        ours = model.model.norm(hidden)
        wide = model(input_ids=ids).logits
    assert ours.dtype == wide.dtype == torch.float64
    assert not torch.equal(ours, downcast)  # not rounded to fp32 any more
    torch.testing.assert_close(ours, downcast, atol=4 * FP32_EPS * float(ours.abs().max()), rtol=0.0)
    torch.testing.assert_close(
        wide.float(), fp32, atol=1e-5, rtol=1e-5
    )  # the same model, in either precision
    torch.testing.assert_close(float64(tiny_llama())(input_ids=ids).logits, wide, **F64)  # and deterministic
