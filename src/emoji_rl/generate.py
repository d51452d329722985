"""Batched sampling from an in-process model, emoji-constrained or not: the one generation path that
chat, evaluation, data filtering and the hf rollout engine share.

Sampling is from the model's own distribution (no top-k / top-p), so what is sampled is what the
trainer later scores; the grammar mask is the only change to the logits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tqdm.auto import tqdm

from emoji_rl.models import chat_ids
from emoji_rl.prefill import prefill_inputs

if TYPE_CHECKING:
    from transformers import LogitsProcessor, PreTrainedModel, PreTrainedTokenizerBase

Constraint = Literal["grammar", "static", "none"]
# Tokens for one emoji turn: 8 emoji take SmolLM2 up to ~72 tokens and Qwen3.5 a median of 60 (p99
# 95; an emoji is 7.7 Qwen3.5 tokens on average). A turn cut short is a format violation, and batched
# generate stops once every row has ended, so a roomy budget costs little.
MAX_NEW_TOKENS = 96


@dataclass(frozen=True)
class Reply:
    """One sampled reply: the ids as sampled (stop token included when the model stopped)."""

    text: str
    token_ids: tuple[int, ...]
    stopped: bool
    logprobs: tuple[float, ...] = ()
    """Log-probs of `token_ids` under the distribution sampled from (temperature and mask applied);
    empty unless asked for."""


def stop_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The end-of-turn token: `<|im_end|>` for ChatML models, else the tokenizer's EOS."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        return im_end
    assert tokenizer.eos_token_id is not None, "tokenizer has neither <|im_end|> nor an EOS token"
    return tokenizer.eos_token_id


def make_processor(
    tokenizer: PreTrainedTokenizerBase,
    constraint: Constraint,
    vocab_size: int,
    min_emoji: int,
    max_emoji: int,
) -> LogitsProcessor | None:
    if constraint == "none":
        return None
    from emoji_rl.emoji import constraint as emoji_constraint
    from emoji_rl.emoji import logits as emoji_logits

    if constraint == "static":
        return emoji_logits.StaticMaskLogitsProcessor(tokenizer)
    compiled = emoji_constraint.compile_emoji_grammar(tokenizer, min_emoji, max_emoji, vocab_size=vocab_size)
    return emoji_logits.EmojiLogitsProcessor(compiled)


def generate_from_ids(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Sequence[int]],
    constraint: Constraint = "grammar",
    temperature: float = 1.0,
    max_new_tokens: int = MAX_NEW_TOKENS,
    batch_size: int = 16,
    seed: int | None = None,
    min_emoji: int = 2,
    max_emoji: int = 8,
    progress: bool = False,
    return_logprobs: bool = False,
) -> list[Reply]:
    """Sample one reply per prompt (token ids), `batch_size` prompts per `generate` call; a prefix
    that rows of a call share is read once (`emoji_rl.prefill`)."""
    import torch
    from transformers import GenerationConfig

    stop_id = stop_token_id(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_id
    vocab_size = model.get_output_embeddings().weight.shape[0]
    generation_config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        # No truncation: top-k before the grammar mask could leave no allowed token at all.
        top_k=0 if temperature > 0 else None,
        top_p=1.0 if temperature > 0 else None,
        eos_token_id=stop_id,
        pad_token_id=pad_id,
        output_scores=return_logprobs,
        return_dict_in_generate=True,
    )
    if seed is not None:
        torch.manual_seed(seed)
    replies: list[Reply] = []
    device = next(model.parameters()).device
    starts = range(0, len(prompts), batch_size)
    for start in tqdm(starts, desc="generate", unit="batch", disable=not progress):
        chunk = prompts[start : start + batch_size]
        processor = make_processor(tokenizer, constraint, vocab_size, min_emoji, max_emoji)
        ids, mask, cache = prefill_inputs(model, chunk, pad_id)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                past_key_values=cache,
                generation_config=generation_config,
                logits_processor=[processor] if processor is not None else None,
            )
        new_ids = out.sequences[:, ids.shape[1] :]
        if return_logprobs:
            # `scores` are the logits after every processor (temperature, grammar mask): exactly the
            # distribution each token was drawn from.
            steps = torch.stack(out.scores, dim=1).float().log_softmax(dim=-1)
            chosen = steps.gather(-1, new_ids.unsqueeze(-1)).squeeze(-1).tolist()
        for i, row in enumerate(new_ids.tolist()):
            reply = _reply(tokenizer, row, stop_id, pad_id)
            if return_logprobs:
                reply = dataclasses.replace(reply, logprobs=tuple(chosen[i][: len(reply.token_ids)]))
            replies.append(reply)
    return replies


def _reply(tokenizer: PreTrainedTokenizerBase, row: list[int], stop_id: int, pad_id: int) -> Reply:
    # Generation pads rows that stopped early; keep the ids up to and including the stop token.
    stopped = stop_id in row
    kept = row[: row.index(stop_id) + 1] if stopped else row
    if not stopped and pad_id != stop_id:
        while kept and kept[-1] == pad_id:
            kept = kept[:-1]
    text_ids = kept[:-1] if stopped else kept
    return Reply(tokenizer.decode(text_ids, skip_special_tokens=True), tuple(kept), stopped)


def generate_replies(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[list[dict[str, str]]],
    **options: Any,
) -> list[Reply]:
    """Sample one assistant reply per chat, through the shared chat template; `options` are
    `generate_from_ids`'s."""
    prompts = [chat_ids(tokenizer, conversation) for conversation in conversations]
    return generate_from_ids(model, tokenizer, prompts, **options)
