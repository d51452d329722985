"""The chat template and the ids that end a turn: how every stage turns messages into tokens, and
multi-turn episodes grow as token ids without being re-tokenized."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from emoji_rl.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


_CHATML_END = "<|im_end|>"


@functools.cache
def generation_eos_ids(model: str) -> tuple[int, ...]:
    """The `eos_token_id` of a model's generation config, read as vLLM 0.33 reads it: the model's
    generation_config.json, else one derived from its config.json, else none
    (`try_get_generation_config` in vllm/transformers_utils/config.py). `model`: a directory or hub id."""
    if not model:
        return ()
    from transformers import AutoConfig, GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(model)
    except OSError:
        try:
            config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model))
        except (OSError, ValueError):
            return ()
    eos = config.eos_token_id
    return () if eos is None else tuple([eos] if isinstance(eos, int) else eos)


def stop_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The end-of-turn token: `<|im_end|>` for ChatML models, else the tokenizer's EOS."""
    im_end = tokenizer.convert_tokens_to_ids(_CHATML_END)
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        return im_end
    assert tokenizer.eos_token_id is not None, "tokenizer has neither <|im_end|> nor an EOS token"
    return tokenizer.eos_token_id


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """Every id that ends a message, as a vLLM server of the same model ends it: the tokenizer's EOS,
    `<|im_end|>` where a ChatML vocabulary's EOS is something else (the stop id our requests send),
    and each `eos_token_id` of the generation config of the model the tokenizer was loaded from.

    vLLM 0.33 adds the generation config's ids to every request's stop set, `--generation-config
    vllm` included, and passes that set to xgrammar as `override_stop_tokens`
    (`SamplingParams.update_from_generation_config`, `XgrammarBackend.compile_grammar`): any of them
    may end a constrained message. The grammar, the decode loop and the games use this one set, so
    the trainer's masks and the server's agree wherever a message can end."""
    im_end = tokenizer.convert_tokens_to_ids(_CHATML_END)
    # A vocabulary without `<|im_end|>` maps it to its unk id (SmolLM2's unk is <|endoftext|>, which
    # its generation config may still list as an EOS).
    ids = [tokenizer.eos_token_id, im_end if im_end != tokenizer.unk_token_id else None]
    ids += generation_eos_ids(getattr(tokenizer, "name_or_path", "") or "")
    return tuple(dict.fromkeys(i for i in ids if isinstance(i, int)))


def padding_ids(tokenizer: PreTrainedTokenizerBase, logits_width: int) -> range:
    """The ids a model's logits have past its tokenizer's (Qwen3.5: 248,077 tokens, 248,320 logits):
    rows the LM head is padded with, which decode to no text. The grammar allows none of them; every
    sampler without it masks them (docs/DESIGN.md §2), and the trainer scores over the rest."""
    return range(len(tokenizer), logits_width)


def chat_text(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], add_generation_prompt: bool = True
) -> str:
    """The one chat template call every stage uses. `enable_thinking=False` turns off Qwen3-family
    thinking; templates that do not know the variable ignore it."""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=False
    )


def chat_ids(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], add_generation_prompt: bool = True
) -> list[int]:
    """Token ids of `chat_text`; the template already holds the special tokens, so none are added."""
    return tokenizer(chat_text(tokenizer, messages, add_generation_prompt), add_special_tokens=False)[
        "input_ids"
    ]


_SENTINEL = "\u2063EMOJI_RL_TURN\u2063"


def continuation_ids(
    tokenizer: PreTrainedTokenizerBase,
    history: list[dict[str, str]],
    user_message: dict[str, str],
    action_ids: Sequence[int],
) -> list[int]:
    """Tokens that follow the sampled `action_ids` to add `user_message` and open the next assistant
    turn, exactly as the chat template renders them.

    Multi-turn episodes grow as token ids (prompt, action, observation, action, ...) and are never
    re-tokenized: the grammar admits non-canonical tokenizations. `history` is the chat up to and
    including the last user turn, rendered with a placeholder answer. An action that does not end
    with the template's end-of-turn token (cut off, or ended by another of `end_of_turn_ids`) gets
    that token first, so the context reads as the template writes the turn.
    """
    stop_id = stop_token_id(tokenizer)
    stop_text = tokenizer.decode([stop_id])
    rendered = chat_text(
        tokenizer,
        [*history, {"role": "assistant", "content": _SENTINEL}, user_message],
        add_generation_prompt=True,
    )
    marker = _SENTINEL + stop_text
    if marker not in rendered:
        raise UserError(
            "the chat template does not end an assistant turn with its stop token "
            f"{stop_text!r}; multi-turn episodes cannot be extended as token ids with it"
        )
    closing = [] if list(action_ids[-1:]) == [stop_id] else [stop_id]
    return (
        closing
        + tokenizer(rendered[rendered.rindex(marker) + len(marker) :], add_special_tokens=False)["input_ids"]
    )
