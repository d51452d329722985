"""The shared opening run once gives the logits and gradients of the full forward pass."""

import pytest
import torch
from tests.floats import F64, float64
from tests.tiny import tiny_llama, tiny_qwen3_5

from emoji_rl.decode.shared_prefix import kept_logits, shared_prefix_length


def test_the_shared_prefix_stops_at_the_first_difference_padding_or_kept_position():
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 1, 0], [5, 6, 7, 8, 2]])
    full = torch.ones_like(ids)
    none = torch.zeros_like(ids, dtype=torch.bool)
    assert shared_prefix_length(ids, full, none) == 3  # row 1 differs at 3
    padded = full.clone()
    padded[1, 2:] = 0
    assert shared_prefix_length(ids, padded, none) == 2  # row 1 is padding from 2 on
    keep = none.clone()
    keep[2, 1] = True
    assert shared_prefix_length(ids, full, keep) == 1  # row 2's logits at 1 are wanted
    same = ids[:1].repeat(2, 1)
    assert shared_prefix_length(same, torch.ones_like(same), none[:2]) == 4  # one token left to run


def _lora_llama():
    from peft import LoraConfig, get_peft_model

    model = tiny_llama()
    # Non-zero B as well as A, so that the adapter changes the logits and both get gradients.
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False
    )
    return float64(get_peft_model(model, config))  # two paths compared (tests/floats.py)


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.float_paths
def test_logits_and_gradients_are_those_of_the_full_forward_pass():
    model = _lora_llama()
    torch.manual_seed(1)
    opening = torch.randint(1, 64, (1, 7))
    rows = [torch.randint(1, 64, (n,)) for n in (5, 3, 6)]
    width = 7 + max(len(r) for r in rows)
    ids = torch.zeros((3, width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    keep = torch.zeros_like(ids, dtype=torch.bool)
    for d, row in enumerate(rows):
        ids[d, : 7 + len(row)] = torch.cat([opening[0], row])
        attention[d, : 7 + len(row)] = 1
        keep[d, 8 : 7 + len(row) - 1] = True  # the "answer": the last tokens of the row, not the first
    assert shared_prefix_length(ids, attention, keep) == 7

    # The oracle: transformers' own forward over every position, the kept ones picked out after.
    full = model(input_ids=ids, attention_mask=attention).logits[keep]
    full.square().sum().backward()
    expected = _grads(model)
    model.zero_grad()

    shared = kept_logits(model, ids, attention, keep, share_prefix=True)
    assert shared.shape == full.shape
    torch.testing.assert_close(shared, full, **F64)
    shared.square().sum().backward()
    got = _grads(model)
    assert got.keys() == expected.keys() and all(g.abs().sum() > 0 for g in got.values())
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], **F64, msg=name)

    plain = kept_logits(model, ids, attention, keep, share_prefix=False)
    torch.testing.assert_close(plain, full.detach(), **F64)


@pytest.mark.parametrize("rows", [1, 2])
def test_nothing_shared_runs_the_plain_forward_pass(rows):
    model = _lora_llama()
    ids = torch.arange(1, 1 + 6 * rows).reshape(rows, 6)  # rows differ from the first token
    attention = torch.ones_like(ids)
    keep = torch.zeros_like(ids, dtype=torch.bool)
    keep[:, 2:5] = True
    expected = model(input_ids=ids, attention_mask=attention).logits[keep]
    torch.testing.assert_close(kept_logits(model, ids, attention, keep, share_prefix=True), expected)


def test_a_model_with_linear_attention_runs_the_plain_pass():
    model = tiny_qwen3_5()
    ids = torch.cat([torch.full((3, 6), 7), torch.arange(1, 13).reshape(3, 4)], dim=1)
    attention = torch.ones_like(ids)
    keep = torch.zeros_like(ids, dtype=torch.bool)
    keep[:, 7:] = True
    expected = model(input_ids=ids, attention_mask=attention).logits[keep]
    torch.testing.assert_close(kept_logits(model, ids, attention, keep, share_prefix=True), expected)
