"""Activation checkpointing of the GRPO policy, on a tiny Qwen3.5 built with transformers' own classes."""

from __future__ import annotations

import torch
from tests.tiny import saved, tiny_qwen3_5

from emoji_rl.lm import models
from emoji_rl.rl.policy import build_policy, checkpoint_layers


def _policy(base: str):
    torch.manual_seed(0)
    policy = build_policy(base, models.pick_runtime("cpu"), None, None)
    for (
        name,
        param,
    ) in policy.named_parameters():  # a fresh LoRA B is zero: give every adapter a gradient path
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    return policy


def _gradients_and_mlp_calls(policy, input_ids):
    calls = []
    hooks = [
        layer.mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        for layer in policy.get_base_model().model.layers
    ]
    policy.zero_grad(set_to_none=True)
    policy(input_ids=input_ids).logits.float().logsumexp(-1).sum().backward()
    for hook in hooks:
        hook.remove()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}
    return grads, len(calls)


def test_checkpointing_recomputes_each_layer_and_keeps_the_gradient(tmp_path):
    base = saved(tiny_qwen3_5(), tmp_path / "base")
    input_ids = torch.randint(0, 64, (2, 12))
    plain, checkpointed = _policy(base), _policy(base)
    checkpoint_layers(checkpointed)
    layers = len(plain.get_base_model().model.layers)

    expected, plain_calls = _gradients_and_mlp_calls(plain, input_ids)
    got, checkpointed_calls = _gradients_and_mlp_calls(checkpointed, input_ids)

    assert plain_calls == layers
    assert checkpointed_calls == 2 * layers  # once forward, once again in the backward pass
    assert got.keys() == expected.keys() and expected
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # Only the decoder layers switched to training mode: no dropout anywhere inside them.
    layer = checkpointed.get_base_model().model.layers[0]
    assert layer.training and not layer.mlp.training and not checkpointed.training
    # A forward without gradients (sampling, the reference) runs each layer once.
    calls = []
    hook = layer.mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        checkpointed(input_ids=input_ids)
    hook.remove()
    assert len(calls) == 1
