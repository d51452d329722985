"""Tiny random models built from the real transformers classes, for tests that need an architecture's
module layout (not its weights): Qwen3.5's text model with both kinds of decoder layer, and Llama."""

from __future__ import annotations

from pathlib import Path

_SIZES = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1
)


def tiny_qwen3_5(**config):
    """A `Qwen3_5ForCausalLM` (the real class, text only) of 4 decoder layers in Qwen3.5's own pattern:
    3 linear_attention (Gated DeltaNet), then 1 full_attention; `config`: more Qwen3_5TextConfig fields
    (a tokenizer's vocabulary size and token ids). Seeded: the same weights every time."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    linear = dict(
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8
    )
    config = Qwen3_5TextConfig(**{**_SIZES, **config}, **linear, num_hidden_layers=4, head_dim=16)
    assert config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(config)


def tiny_llama(**config):
    """A `LlamaForCausalLM` of 2 decoder layers; `config`: more LlamaConfig fields (e.g. a tokenizer's
    vocab_size). Seeded: the same weights every time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**_SIZES, **config}, num_hidden_layers=2))


def saved(model, directory: Path) -> str:
    """`model` saved where `models.load_causal_lm` (a local-directory spec) loads it from."""
    model.save_pretrained(directory)
    return str(directory)
