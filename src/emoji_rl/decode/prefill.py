"""How a batch of prompts is laid out before it is decoded, and how a prefix that several rows
share is read once instead of once per row.

A GRPO group's G episodes start from one prompt and keep it as the head of every later turn, and
every chat of an evaluation starts with the same system prompt. Batched prefill would read such a
prefix once per row: on 2 CPU cores a 61-token prompt cost 70 ms per row even at batch 16, as much
as the ~14 tokens decoded after it. So the rows are clustered by common prefix, each cluster's
prefix is run once into a KV cache, the cache is copied out to the cluster's rows, and decoding
reads only what follows. A row is laid out as [pad | prefix | pad | rest]: every prefix ends at the
same column, the pads are masked out, and `emoji_rl.decode.generate.decode` takes position ids from the
attention mask, so each row attends to exactly its own prompt at its own positions.

A later turn of an episode goes further: the rows of the last turn's batch are cut out of its KV
cache as they stop (`cut_rows`) and the next turn reads only what the game wrote since
(`resume_inputs`), laid out the same way with the row's own cache as its prefix. A model with
linear-attention layers (Qwen3.5's Gated DeltaNet) keeps a running state there instead of keys and
values, and a masked gap before the new tokens would not leave it alone (a pad still decays the
state and shifts the convolution's window), so its rows first read all that is new but the last
token, with no gap: rows with as many new tokens together, one forward pass per length. Every row
then has one token left, and decoding reads those together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, LinearAttentionLayer

# Sharing costs an extra forward pass and a copy of the cache: below this share of prefill tokens
# saved it is not worth it.
MIN_SAVING = 0.25


class Prefilled(NamedTuple):
    """A batch laid out for decoding: left-padded prompts and their attention mask, of which `cache`
    (None: nothing read yet) already holds the first columns."""

    ids: torch.Tensor
    mask: torch.Tensor
    cache: Cache | None

    def to(self, device: torch.device | str) -> Prefilled:
        """The ids and the mask on `device`; the cache is where the model that read it put it."""
        return Prefilled(self.ids.to(device), self.mask.to(device), self.cache)


@dataclass(frozen=True)
class PrefixPlan:
    cluster: tuple[int, ...]
    """Per row, the index of its cluster."""
    prefix: tuple[int, ...]
    """Per cluster, the number of leading tokens its rows share (0: a row on its own)."""


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
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
    for every t that occurs, covers a batch of G-row groups (large t) and a batch of chats that
    share only a system prompt (small t). A row keeps at least its last token out of the prefix:
    decoding must read one token to give the first logits.
    """
    n = len(prompts)
    if n < 2:
        return None
    order = sorted(range(n), key=lambda i: tuple(prompts[i]))
    shared = [
        min(common_length(prompts[a], prompts[b]), len(prompts[a]) - 1, len(prompts[b]) - 1)
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


def full_attention(cache: Cache) -> bool:
    """True when every layer's cache is plain full attention, the only kind a prefix can be moved in
    and out of. The masked gap between prefix and rest would count toward a sliding window, and a
    linear-attention layer (Qwen3.5's Gated DeltaNet) would run its recurrence over it."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in cache.layers)


def continuable(cache: Cache) -> bool:
    """True when a row can be cut out of every layer of `cache` and carried into a next turn: full
    attention (keys and values) or linear attention (one running state)."""
    from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

    return all(
        type(layer) is DynamicLayer or (type(layer) is LinearAttentionLayer and layer.number_of_states == 1)
        for layer in cache.layers
    )


def can_share_prefixes(model: PreTrainedModel) -> bool:
    from transformers.cache_utils import DynamicCache

    return full_attention(DynamicCache(config=model.config))


@dataclass(frozen=True)
class RowCache:
    """One row's keys and values as its last decode step left them: every token of the row but the
    last one sampled, which no forward pass has read yet."""

    ids: torch.Tensor
    """[W] the ids of the cached columns, pads included."""
    mask: torch.Tensor
    """[W] 1 on the row's own tokens, 0 on pads."""
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    """Per layer, keys and values [kv heads, W, head dim], or for a linear-attention layer its
    convolution window and recurrent state after the row's last cached column."""

    def tokens(self) -> tuple[int, ...]:
        return tuple(self.ids[self.mask.bool()].tolist())


def _row_states(
    layer: CacheLayerMixin | LinearAttentionLayer, p: int, first: int
) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers.cache_utils import LinearAttentionLayer

    if isinstance(layer, LinearAttentionLayer):
        return layer.conv_states[0][p].clone(), layer.recurrent_states[0][p].clone()
    return layer.keys[p, :, first:].clone(), layer.values[p, :, first:].clone()


def cut_rows(cache: Cache, ids: torch.Tensor, mask: torch.Tensor, positions: Sequence[int]) -> list[RowCache]:
    """Copies of the rows at `positions` of a `continuable` cache whose columns `ids` and `mask`
    describe, without their leading pads."""
    rows = []
    for p in positions:
        first = int(mask[p].argmax())  # the first 1
        layers = tuple(_row_states(layer, p, first) for layer in cache.layers)
        rows.append(RowCache(ids[p, first:].clone(), mask[p, first:].clone(), layers))
    return rows


def join_rows(
    model: PreTrainedModel, rows: Sequence[RowCache], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, DynamicCache]:
    """(ids, attention mask, cache) of `rows` in one batch, each right-aligned: keys and values
    left-padded to the widest row, linear-attention states stacked."""
    import torch
    from transformers.cache_utils import DynamicCache, LinearAttentionLayer

    width = max(len(row.ids) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row.ids) :], mask[i, width - len(row.ids) :] = row.ids.cpu(), row.mask.cpu()
    joined = DynamicCache(config=model.config)
    for index, layer in enumerate(joined.layers):
        first, second = zip(*(row.layers[index] for row in rows), strict=True)
        if isinstance(layer, LinearAttentionLayer):
            layer.update_conv_state(torch.stack(first))
            layer.update_recurrent_state(torch.stack(second))
            continue
        shape = (len(rows), first[0].shape[0], width, first[0].shape[2])
        keys, values = first[0].new_zeros(shape), second[0].new_zeros(shape)
        for i, (row_keys, row_values) in enumerate(zip(first, second, strict=True)):
            keys[i, :, width - row_keys.shape[1] :], values[i, :, width - row_keys.shape[1] :] = (
                row_keys,
                row_values,
            )
        joined.update(keys, values, index)
    return ids, mask, joined


def read_on(
    model: PreTrainedModel, rows: Sequence[RowCache], new: Sequence[Sequence[int]], pad_id: int
) -> list[RowCache]:
    """Each row's cache after it also reads its `new` tokens, with no gap between them and the cache:
    rows with as many new tokens in one forward pass."""
    import torch

    by_length: dict[int, list[int]] = {}
    for i, tokens in enumerate(new):
        if tokens:
            by_length.setdefault(len(tokens), []).append(i)
    out = list(rows)
    device = next(model.parameters()).device
    for length, members in by_length.items():
        ids, mask, cache = join_rows(model, [rows[i] for i in members], pad_id)
        tokens = torch.tensor([list(new[i]) for i in members], dtype=torch.long)
        positions = mask.sum(-1, keepdim=True) + torch.arange(length)
        mask = torch.cat([mask, mask.new_ones(len(members), length)], 1)
        with torch.no_grad():
            model(
                input_ids=tokens.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        cut = cut_rows(cache, torch.cat([ids, tokens], 1), mask, range(len(members)))
        for i, row in zip(members, cut, strict=True):
            out[i] = row
    return out


def resume_inputs(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], caches: Sequence[RowCache | None], pad_id: int
) -> Prefilled | None:
    """The batch that goes on from each row's cache, laid out [pad | cache |
    pad | rest]; None unless every prompt is its row's cached tokens and more. With linear-attention
    layers the rows first read all their rest but its last token (`read_on`), so no pad comes between
    a state and what follows it."""
    import torch
    from transformers.cache_utils import DynamicCache

    rows = [cache for cache in caches if cache is not None]
    heads = [row.tokens() for row in rows]
    if len(rows) < len(prompts) or any(
        len(prompt) <= len(head) or tuple(prompt[: len(head)]) != head
        for prompt, head in zip(prompts, heads, strict=True)
    ):
        return None
    rests = [prompt[len(head) :] for prompt, head in zip(prompts, heads, strict=True)]
    if not full_attention(DynamicCache(config=model.config)):
        rows = read_on(model, rows, [rest[:-1] for rest in rests], pad_id)
        rests = [rest[-1:] for rest in rests]
    head_ids, head_mask, joined = join_rows(model, rows, pad_id)
    rest_ids, rest_mask = left_pad(rests, pad_id)
    return Prefilled(torch.cat([head_ids, rest_ids], 1), torch.cat([head_mask, rest_mask], 1), joined)


def prefill_inputs(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    caches: Sequence[RowCache | None] | None = None,
) -> Prefilled:
    """The batch to decode from: going on from each row's cache
    when every prompt extends it, else reading shared prefixes once. Without a worthwhile plan (or a
    model that cannot share), plain left padding and no cache."""
    import torch
    from transformers.cache_utils import DynamicCache

    if caches is not None and (resumed := resume_inputs(model, prompts, caches, pad_id)) is not None:
        return resumed
    plan = plan_prefixes(prompts)
    if plan is None or not can_share_prefixes(model):  # the plan first: a batch of one has none
        return Prefilled(*left_pad(prompts, pad_id), None)
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
            # As decode computes them from the whole row's mask, so the cached keys match.
            position_ids=(head_mask.cumsum(-1) - 1).clamp(min=0).to(device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    rows = torch.tensor(plan.cluster)
    cache.reorder_cache(rows.to(device))
    return Prefilled(
        torch.cat([head_ids[rows], rest_ids], 1), torch.cat([head_mask[rows], rest_mask], 1), cache
    )
