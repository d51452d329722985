"""Logits at chosen positions of a right-padded batch, its shared opening run once: for training
passes what `emoji_rl.decode.prefill` is for decoding.

Every chat the sender trains on opens with the same tokens: the system prompt and the instruction
before the message, about 50 of SmolLM2's 70-90 (docs/DESIGN.md §5), and a GRPO group's episodes
share their whole prompt. A training forward pass can run the opening once, for one row, and give
every row its keys and values as a cache; the rows' own tokens then attend to it. The gradient flows
through the cache back into the one prefix pass, so loss and gradients are those of the full batch
(tests/test_shared_prefix.py compares them). On 2 cores, 8 chats: forward + backward 1.8 s instead of
2.8 s with the LM head on the kept positions alone, and 3.5-4.2 s with it on every position.

A cache is extended in place, so the layers must not be recomputed (activation checkpointing), and
two forward passes feed one backward pass, which DDP and FSDP do not allow: callers use it in a
single process without checkpointing. Models with other than full-attention layers run the plain pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: torch.Tensor) -> int:
    """Tokens every row opens with, unpadded, up to (not including) the first kept position of any row.

    Stopping before a kept position means no logits are needed from the prefix pass; at least one
    token of each row stays outside the prefix, since a row with nothing kept is padding."""
    same = (input_ids == input_ids[:1]).all(dim=0) & attention_mask.bool().all(dim=0)
    same &= ~keep.any(dim=0)
    differs = (~same).nonzero()
    return int(differs[0]) if len(differs) else input_ids.shape[1] - 1


class _HeadColumns(torch.nn.Module):
    """The LM head projecting onto some vocabulary ids only: its weight's rows at those ids, read
    at call time (under FSDP the weight is whole only during the forward pass). It holds no
    parameters of its own, so the model's parameters and their names do not change."""

    def __init__(self, head: torch.nn.Linear, ids: torch.Tensor) -> None:
        super().__init__()
        self._head = (head,)  # in a tuple: not registered as a submodule
        self._ids = ids

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        (head,) = self._head
        ids = self._ids.to(head.weight.device)
        bias = head.bias[ids] if head.bias is not None else None
        return torch.nn.functional.linear(hidden, head.weight[ids], bias)


def _hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under DDP's `.module` and PEFT's wrappers (FSDP2 wraps in place)."""
    while hasattr(model, "module"):
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def _head_swapped(
    model: torch.nn.Module, make: Callable[[torch.nn.Module], torch.nn.Module | None]
) -> Iterator[torch.nn.Module | None]:
    """While open, the model's LM head is `make(head)`, and the original head is yielded; when
    `make` gives None the head is left alone and None is yielded."""
    inner = _hf_model(model)
    head = inner.get_output_embeddings()
    swapped = make(head)
    if swapped is None:
        yield None
        return
    inner.set_output_embeddings(swapped)
    try:
        yield head
    finally:
        inner.set_output_embeddings(head)


def _columns(vocabulary: torch.Tensor) -> Callable[[torch.nn.Module], torch.nn.Module | None]:
    """A plain linear head onto `vocabulary`'s ids; an adapted head is not narrowed (None)."""
    return lambda head: _HeadColumns(head, vocabulary) if type(head) is torch.nn.Linear else None


def kept_logits(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep: torch.Tensor,
    share_prefix: bool,
    vocabulary: torch.Tensor | None = None,
) -> torch.Tensor:
    """[N, V] logits at the N positions where `keep` [B, L] is true, in row-major order: the LM head
    projects only those (transformers' boolean `logits_to_keep`), never the [B, L, V] logits.
    `share_prefix` runs the rows' common opening once (see the module's docstring).

    `vocabulary`: ids (int64 [S]) whose logits alone are wanted, [N, S]: the head multiplies by S
    rows of its weight instead of V (for Qwen3.5 under the emoji grammar, 240 of 248,320)."""
    if vocabulary is None:
        return _kept_logits(model, input_ids, attention_mask, keep, share_prefix)
    with _head_swapped(model, _columns(vocabulary)) as narrowed:
        logits = _kept_logits(model, input_ids, attention_mask, keep, share_prefix)
    return logits if narrowed is not None else logits[:, vocabulary.to(logits.device)]


def head_columns(head: torch.nn.Module, vocabulary: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """`head` (as `kept_hidden` returns it) onto `vocabulary`'s ids only: [N, H] -> [N, S], multiplying
    by S rows of its weight where it is a plain linear head, else the whole head's columns picked."""
    narrowed = _columns(vocabulary)(head)
    if narrowed is not None:
        return narrowed
    return lambda hidden: head(hidden)[..., vocabulary.to(hidden.device)]


def kept_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep: torch.Tensor,
    share_prefix: bool,
) -> tuple[torch.Tensor, torch.nn.Module]:
    """([N, H] final hidden states at the kept positions, the LM head): for a caller that applies
    the head itself, a few positions at a time."""
    with _head_swapped(model, lambda _: torch.nn.Identity()) as head:
        hidden = _kept_logits(model, input_ids, attention_mask, keep, share_prefix)
    assert head is not None
    return hidden, head


def _kept_logits(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep: torch.Tensor,
    share_prefix: bool,
) -> torch.Tensor:
    from emoji_rl.decode.prefill import can_share_prefixes

    share_prefix = share_prefix and can_share_prefixes(model)
    prefix = shared_prefix_length(input_ids, attention_mask, keep) if share_prefix else 0
    if prefix < 2 or input_ids.shape[0] < 2:
        return model(
            input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep, use_cache=False
        ).logits
    opening = model(input_ids=input_ids[:1, :prefix], use_cache=True, logits_to_keep=1)
    cache = opening.cache
    cache.batch_repeat_interleave(input_ids.shape[0])
    return model(
        input_ids=input_ids[:, prefix:],
        attention_mask=attention_mask,
        cache=cache,
        use_cache=True,
        logits_to_keep=keep[:, prefix:],
    ).logits
