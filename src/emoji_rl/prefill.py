"""How a batch of prompts is laid out before `generate` decodes it, and how a prefix that several rows
share is read once instead of once per row.

A GRPO group's G episodes start from one prompt and keep it as the head of every later turn, and
every chat of an evaluation starts with the same system prompt. Batched prefill would read such a
prefix once per row: on 2 CPU cores a 61-token prompt cost 70 ms per row even at batch 16, as much
as the ~14 tokens decoded after it. So the rows are clustered by common prefix, each cluster's
prefix is run once into a KV cache, the cache is copied out to the cluster's rows, and `generate`
reads only what follows. A row is laid out as [pad | prefix | pad | rest]: every prefix ends at the
same column, the pads are masked out, and generate takes position ids from the attention mask, so
each row attends to exactly its own prompt at its own positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import DynamicCache

# Sharing costs an extra forward pass and a copy of the cache: below this share of prefill tokens
# saved it is not worth it.
MIN_SAVING = 0.25


@dataclass(frozen=True)
class PrefixPlan:
    cluster: tuple[int, ...]
    """Per row, the index of its cluster."""
    prefix: tuple[int, ...]
    """Per cluster, the number of leading tokens its rows share (0: a row on its own)."""


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefill_tokens(prompts: Sequence[Sequence[int]], plan: PrefixPlan | None) -> int:
    """Token positions batched prefill computes: with a plan, each cluster's prefix padded to the
    longest prefix plus each row's rest padded to the longest rest; without, every row padded."""
    if plan is None:
        return len(prompts) * max(map(len, prompts))
    rest = max(len(p) - plan.prefix[c] for p, c in zip(prompts, plan.cluster, strict=True))
    return len(plan.prefix) * max(plan.prefix) + len(prompts) * rest


def plan_prefixes(prompts: Sequence[Sequence[int]], min_saving: float = MIN_SAVING) -> PrefixPlan | None:
    """The clusters of rows sharing a prefix that make `prefill_tokens` smallest, or None when they
    save less than `min_saving` of it.

    Sorted, rows with a common prefix are neighbours, and a cluster shares the shortest common prefix
    between its neighbours. Splitting the sorted rows wherever neighbours share fewer than t tokens,
    for every t that occurs, covers both a batch of G-row groups (large t) and a batch of chats that
    share only a system prompt (small t). A row keeps at least its last token out of the prefix:
    generate must read one token to give the first logits.
    """
    n = len(prompts)
    if n < 2:
        return None
    order = sorted(range(n), key=lambda i: tuple(prompts[i]))
    shared = [
        min(_common_length(prompts[a], prompts[b]), len(prompts[a]) - 1, len(prompts[b]) - 1)
        for a, b in pairwise(order)
    ]
    best, best_tokens = None, prefill_tokens(prompts, None) * (1 - min_saving)
    for threshold in sorted({s for s in shared if s > 0}):
        cluster, prefix, start = [0] * n, [], 0
        for k in range(n):
            if k == n - 1 or shared[k] < threshold:
                for i in order[start : k + 1]:
                    cluster[i] = len(prefix)
                prefix.append(min(shared[start:k]) if k > start else 0)
                start = k + 1
        plan = PrefixPlan(tuple(cluster), tuple(prefix))
        if (tokens := prefill_tokens(prompts, plan)) < best_tokens:
            best, best_tokens = plan, tokens
    return best


def left_pad(
    rows: Sequence[Sequence[int]], pad_id: int, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), each row right-aligned in `width` columns (default: the longest row)."""
    import torch

    width = max(map(len, rows)) if width is None else width
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


def can_share_prefixes(model: PreTrainedModel) -> bool:
    """True when every layer's cache is plain full attention. The masked gap between prefix and rest
    would count toward a sliding window, and a linear-attention layer (Qwen3.5's Gated DeltaNet)
    would run its recurrence over it."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def prefill_inputs(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, DynamicCache | None]:
    """(input ids, attention mask, KV cache of the shared prefixes or None) to pass to `generate`.
    Without a worthwhile plan (or a model that cannot share), plain left padding and no cache."""
    import torch
    from transformers.cache_utils import DynamicCache

    plan = plan_prefixes(prompts)
    if plan is None or not can_share_prefixes(model):  # the plan first: a batch of one has none
        return (*left_pad(prompts, pad_id), None)
    heads: list[Sequence[int]] = [()] * len(plan.prefix)
    for prompt, c in zip(prompts, plan.cluster, strict=True):
        heads[c] = prompt[: plan.prefix[c]]
    head_ids, head_mask = left_pad(heads, pad_id, max(plan.prefix))
    rest_ids, rest_mask = left_pad(
        [p[plan.prefix[c] :] for p, c in zip(prompts, plan.cluster, strict=True)], pad_id
    )
    cache = DynamicCache(config=model.config)
    device = next(model.parameters()).device
    with torch.no_grad():
        model(
            input_ids=head_ids.to(device),
            attention_mask=head_mask.to(device),
            # As generate computes them from the whole row's mask, so the cached keys match.
            position_ids=(head_mask.cumsum(-1) - 1).clamp(min=0).to(device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    rows = torch.tensor(plan.cluster)
    cache.reorder_cache(rows.to(device))
    return torch.cat([head_ids[rows], rest_ids], 1), torch.cat([head_mask[rows], rest_mask], 1), cache
