"""Tiny random models built from the real transformers classes, for tests that need an architecture's
module layout (not its weights): Qwen3.5's text model with both kinds of decoder layer, and Llama; and
Qwen3.5's real vocabulary as an HF tokenizer, for a tiny model as wide as Qwen3.5's logits."""

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


QWEN3_5_LOGITS = 248320
"""Qwen3.5's lm_head width: its tokenizer's 248,077 ids, padded."""


def qwen3_5_vocabulary():
    """The real Qwen3.5 vocabulary (`qwen_vocab`: token bytes by id, specials after them) as an HF
    byte-level tokenizer, the form Qwen3.5's tokenizer.json has, without its merges (masks depend on
    the token strings only): `<|im_end|>` is EOS, `<|endoftext|>` the pad token."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as token_models
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from emoji_rl.emoji.qwen_vocab import qwen_raw_vocab, qwen_tokenizer

    vocab = qwen_raw_vocab("qwen3.5")
    regular = qwen_tokenizer("qwen3.5").eod_id  # <|endoftext|>, the first special token
    to_char = bytes_to_unicode()
    pieces = {"".join(to_char[b] for b in vocab.token_bytes[i]): i for i in range(regular)}
    backend = Tokenizer(token_models.BPE(vocab=pieces, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    specials = [token.decode() for token in vocab.token_bytes[regular:]]
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


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
