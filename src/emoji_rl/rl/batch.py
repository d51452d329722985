"""From played episodes to the tensors of one update, and log-probs under the emoji constraint.

Every per-token tensor here is aligned with the *targets*: position t holds the token `ids[:, t+1]`,
predicted by the logits at t. The loss mask is 1 where that token was sampled by the policy. A row is
one episode's turns in one seat (`EpisodeGroup.rows`); rows sampled under the grammar and rows of free
text train together, in one batch and one update (docs/DESIGN.md §14).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from emoji_rl.decode.shared_prefix import head_columns, kept_hidden, kept_logits
from emoji_rl.emoji.constraint import EmojiConstraint, support_masks
from emoji_rl.play.types import Episode, EpisodeGroup, Seat
from emoji_rl.rl import grpo

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Batch:
    """D episodes, right-padded to T+1 tokens."""

    input_ids_D_T: torch.Tensor
    """[D, T+1] token ids (the model reads all but the last)."""
    attention_D_T: torch.Tensor
    mask_D_T: torch.Tensor
    """[D, T] bool: the target token was sampled by the sender."""
    sampler_logp_D_T: torch.Tensor
    """[D, T] the sampler's log-probs of the target tokens (0 off the mask)."""
    advantages_D: torch.Tensor
    allowed_N_S: list[torch.Tensor]
    """Per row, [n_d, S] bool: what the grammar allowed before each of its policy tokens, in order,
    over the ids of `support` (empty when unconstrained; [0, S] for a row of free text beside them)."""
    support: torch.Tensor | None = None
    """The S vocabulary ids the grammar can ever allow (`EmojiConstraint.support`); None: unconstrained."""
    lag_D_T: torch.Tensor | None = None
    """[D, T] long: how many versions before the trained weights the target token's turn was
    sampled (0 off the mask, and for turns sampled in-process); None: all 0."""
    tokens: int | None = None
    """The tokenizer's length: unconstrained, log-probs are over the ids below it, the LM head's
    padding rows masked as every sampler masks them (`template.padding_ids`); None: the whole head."""
    constrained_D: torch.Tensor | None = None
    """[D] bool: the row was sampled under the grammar, where rows of free text sit beside such rows
    (the seats of one game); None: every row as `support` says."""

    def rows(self, start: int, stop: int) -> Batch:
        """Rows `start:stop`, their padding cut to their own longest row (never a position the loss
        counts): the batch is padded to its longest, and a micro-batch of short rows beside long ones
        (one seat's chat five times another's: docs/DESIGN.md §5) would otherwise run mostly padding."""
        attention, mask = self.attention_D_T[start:stop], self.mask_D_T[start:stop]
        counted = mask.any(dim=0).nonzero()
        width = max(
            int(attention.sum(dim=1).max()) if len(attention) else 0,
            int(counted[-1]) + 2 if len(counted) else 0,
            2,
        )
        return Batch(
            self.input_ids_D_T[start:stop, :width],
            attention[:, :width],
            mask[:, : width - 1],
            self.sampler_logp_D_T[start:stop, : width - 1],
            self.advantages_D[start:stop],
            self.allowed_N_S[start:stop],
            self.support,
            None if self.lag_D_T is None else self.lag_D_T[start:stop, : width - 1],
            self.tokens,
            None if self.constrained_D is None else self.constrained_D[start:stop],
        )

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.input_ids_D_T.to(device),
            self.attention_D_T.to(device),
            self.mask_D_T.to(device),
            self.sampler_logp_D_T.to(device),
            self.advantages_D.to(device),
            self.allowed_N_S,
            self.support,
            None if self.lag_D_T is None else self.lag_D_T.to(device),
            self.tokens,
            self.constrained_D,
        )

    @property
    def size(self) -> int:
        return self.input_ids_D_T.shape[0]


def collate(
    episodes: Sequence[Episode],
    advantages_D: torch.Tensor,
    pad_id: int,
    constraint: EmojiConstraint | None,
    step: int = 0,
    tokens: int | None = None,
    constrained: Sequence[bool] | None = None,
) -> Batch:
    """Stack episodes into padded tensors; replay the grammar over each policy turn (if constrained),
    keeping its masks over the grammar's support only: at Qwen3.5's real shapes (a step of 128
    five-turn episodes, 24,739 sender tokens) full-width masks took 5.7 GiB of host memory
    (`make bench-scale`). Each policy token's lag is `step` (the version of the weights it trains)
    minus the version that sampled its turn. `constrained`: per row, whether it was sampled under
    `constraint` (rows of free text beside it); None: every row is, if there is one."""
    # Rows of the two kinds side by side; rows of one kind alone take that kind's own path.
    mixed = constraint is not None and constrained is not None and any(constrained) and not all(constrained)
    sequences = [episode.token_ids() for episode in episodes]
    width = max(map(len, sequences))
    ids = torch.full((len(episodes), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(episodes), width), dtype=torch.long)
    mask = torch.zeros((len(episodes), width - 1), dtype=torch.bool)
    sampler_logp = torch.zeros((len(episodes), width - 1))
    lag = torch.zeros((len(episodes), width - 1), dtype=torch.long)
    allowed: list[torch.Tensor] = []
    for d, (episode, sequence) in enumerate(zip(episodes, sequences, strict=True)):
        ids[d, : len(sequence)] = torch.tensor(sequence)
        attention[d, : len(sequence)] = 1
        target_mask = torch.tensor(episode.loss_mask()[1:], dtype=torch.bool)
        mask[d, : len(sequence) - 1] = target_mask
        sampler_logp[d, : len(sequence) - 1][target_mask] = torch.tensor(
            [lp for turn in episode.turns for lp in turn.action_logprobs]
        )
        lag[d, : len(sequence) - 1][target_mask] = torch.tensor(
            [
                0 if turn.sampler_version is None else step - turn.sampler_version
                for turn in episode.turns
                for _ in turn.action_ids
            ],
            dtype=torch.long,
        )
        if constraint is not None and (constrained is None or constrained[d]):
            allowed.append(torch.cat([support_masks(constraint, turn.action_ids) for turn in episode.turns]))
        elif constraint is not None:
            allowed.append(torch.zeros((0, len(constraint.support)), dtype=torch.bool))
    support = (
        constraint.support if constraint is not None and (constrained is None or any(constrained)) else None
    )
    kinds = torch.tensor(list(constrained), dtype=torch.bool) if mixed else None
    if support is None:
        allowed = []
    return Batch(
        ids, attention, mask, sampler_logp, advantages_D.float(), allowed, support, lag, tokens, kinds
    )


def collate_groups(
    groups: Sequence[EpisodeGroup],
    pad_id: int,
    constraint: EmojiConstraint | None,
    step: int = 0,
    tokens: int | None = None,
    seats: Sequence[Seat] = (),
) -> Batch:
    """A step's groups as one batch, each row (an episode's turns in its group's seat) with the
    advantage its group carries (`collect` set them: `grpo.seat_advantages`), trained at weights
    version `step`; under `constraint` the rows of the `seats` that sample under the grammar (none
    given: every row)."""
    missing = [g.prompt_id for g in groups if len(g.advantages) != len(g.episodes)]
    if missing:
        raise ValueError(
            f"groups {missing[:4]} carry no advantages: collect() sets them (grpo.step_advantages)"
        )
    advantages_D = torch.tensor([a for g in groups for a in g.advantages], dtype=torch.float)
    rows = [row for g in groups for row in g.rows()]
    grammar = {seat.name for seat in seats if seat.constraint == "grammar"}
    constrained = [g.seat in grammar for g in groups for _ in g.episodes] if seats else None
    return collate(rows, advantages_D, pad_id, constraint, step, tokens, constrained)


def token_logprobs(
    model: PreTrainedModel, batch: Batch, temperature: float, share_prefix: bool = False
) -> torch.Tensor:
    """[D, T] log-probs of the target tokens under the grammar mask (0 off the loss mask).

    The logits are computed at the sender's positions only, then masked and normalized: the same
    distribution the sampler drew from (docs/DESIGN.md §6). Under the grammar, only at the ids of its
    support: a softmax over the allowed tokens is the same whether the rest of the vocabulary is
    there at -inf or not, and the [N, V] logits and their fp32 copies are never built. Without a
    grammar (a free-text game), over the tokenizer's ids (`Batch.tokens`) a few hundred positions at a time
    (`grpo.head_token_logprobs`).
    `share_prefix`: the rows' common opening (a group's whole prompt) runs once (`shared_prefix`; one
    process, no activation checkpointing).
    """
    # Projecting only the kept positions through the LM head, as TRL's fused head does, never builds
    # the [D, T, V] logits: SmolLM2 (49K vocabulary), 8 one-turn episodes of 74 tokens: forward +
    # backward 6.6-6.9 s instead of 7.4-7.7 s on 2 cores.
    inputs = (batch.input_ids_D_T[:, :-1], batch.attention_D_T[:, :-1], batch.mask_D_T, share_prefix)
    targets_N = batch.input_ids_D_T[:, 1:][batch.mask_D_T]
    if batch.support is None or batch.constrained_D is not None:
        # One forward pass to the hidden states; then each position's head: over the tokenizer's ids
        # for free text, over the grammar's support for the rows sampled under it.
        hidden_N_H, head = kept_hidden(model, *inputs)
        targets_N = targets_N.to(hidden_N_H.device)
        free_head = head if batch.tokens is None else functools.partial(_narrowed, head, batch.tokens)
        if batch.constrained_D is None:
            logp_N = grpo.head_token_logprobs(hidden_N_H, free_head, targets_N, temperature)
        else:
            logp_N = _mixed_logprobs(batch, hidden_N_H, head, free_head, targets_N, temperature)
    else:
        picked_N_S = kept_logits(model, *inputs, batch.support)
        columns_N = support_columns(batch.support.to(targets_N.device), targets_N)
        allowed = torch.cat(batch.allowed_N_S).to(picked_N_S.device).unsqueeze(0)
        logp_N = grpo.masked_token_logprobs(
            picked_N_S.unsqueeze(0), allowed, columns_N.unsqueeze(0), temperature
        ).squeeze(0)
    out = torch.zeros(batch.mask_D_T.shape, dtype=logp_N.dtype, device=logp_N.device)
    out[batch.mask_D_T] = logp_N
    return out


def _mixed_logprobs(
    batch: Batch,
    hidden_N_H: torch.Tensor,
    head: torch.nn.Module,
    free_head: Callable[[torch.Tensor], torch.Tensor],
    targets_N: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """[N] log-probs at the kept positions of a batch with rows of each kind: a grammar row's
    under its replayed masks over the support, a free row's over the tokenizer's ids (`token_logprobs`'
    two paths, from one forward pass)."""
    assert batch.support is not None and batch.constrained_D is not None
    device = hidden_N_H.device
    grammar_N = batch.constrained_D.to(device)[:, None].expand_as(batch.mask_D_T)[batch.mask_D_T.to(device)]
    logp_N = torch.zeros(targets_N.shape, dtype=torch.float32, device=device)
    if (~grammar_N).any():
        free = grpo.head_token_logprobs(hidden_N_H[~grammar_N], free_head, targets_N[~grammar_N], temperature)
        logp_N = logp_N.to(free.dtype).index_put((~grammar_N).nonzero(as_tuple=True), free)
    if grammar_N.any():
        support = batch.support.to(device)
        picked_N_S = head_columns(head, support)(hidden_N_H[grammar_N])
        columns_N = support_columns(support, targets_N[grammar_N])
        allowed = torch.cat(batch.allowed_N_S).to(device).unsqueeze(0)
        constrained = grpo.masked_token_logprobs(
            picked_N_S.unsqueeze(0), allowed, columns_N.unsqueeze(0), temperature
        ).squeeze(0)
        logp_N = logp_N.to(constrained.dtype).index_put(grammar_N.nonzero(as_tuple=True), constrained)
    return logp_N


def _narrowed(
    head: Callable[[torch.Tensor], torch.Tensor], tokens: int, hidden: torch.Tensor
) -> torch.Tensor:
    return head(hidden)[..., :tokens]


def support_columns(support: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The columns of `ids` in the sorted `support`; every id must be in it (the grammar allowed it)."""
    columns = torch.searchsorted(support, ids).clamp(max=len(support) - 1)
    outside = support[columns] != ids
    if outside.any():
        raise ValueError(
            f"token ids {ids[outside].unique().tolist()[:8]} are outside the grammar's support: "
            "these episodes were not sampled under this constraint"
        )
    return columns
