"""Logits at chosen positions of a right-padded batch, its shared opening run once: for training
passes what `emoji_rl.prefill` is for decoding.

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

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: torch.Tensor) -> int:
    """Tokens every row opens with, unpadded, up to (not including) the first kept position of any row.

    Stopping before a kept position means no logits are needed from the prefix pass; at least one
    token of each row stays outside the prefix, since a row with nothing kept is padding."""
    same = (input_ids == input_ids[:1]).all(dim=0) & attention_mask.bool().all(dim=0)
    same &= ~keep.any(dim=0)
    differs = (~same).nonzero()
    return int(differs[0]) if len(differs) else input_ids.shape[1] - 1


def kept_logits(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep: torch.Tensor,
    share_prefix: bool,
) -> torch.Tensor:
    """[N, V] logits at the N positions where `keep` [B, L] is true, in row-major order: the LM head
    projects only those (transformers' boolean `logits_to_keep`), never the [B, L, V] logits.
    `share_prefix` runs the rows' common opening once (see the module's docstring)."""
    from emoji_rl.prefill import can_share_prefixes

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
