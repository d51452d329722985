"""Logits processors: the exact grammar mask, the seed's static mask as a baseline, and the padding
mask of unconstrained sampling.

HF `LogitsProcessor`s, which `emoji_rl.decode.generate.decode` runs before temperature, so what samples
only ever sees allowed tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import xgrammar as xgr
from transformers import LogitsProcessor

from emoji_rl.emoji.alphabet import ALPHABET, SEPARATOR
from emoji_rl.emoji.constraint import EmojiConstraint, bits_at, pack_bitmask, unpack_bitmask
from emoji_rl.errors import UserError
from emoji_rl.lm.template import end_of_turn_ids

if TYPE_CHECKING:
    from collections.abc import Sequence

    from transformers import PreTrainedTokenizerBase


def _check_width(scores: torch.Tensor, width: int) -> None:
    if scores.shape[-1] != width:
        raise UserError(
            f"the mask is {width} tokens wide but the model's logits are {scores.shape[-1]}: compile "
            "with vocab_size=<the lm_head's output width> (e.g. model.get_output_embeddings().out_features)"
        )


_BITS = torch.arange(32, dtype=torch.int32)


def allowed_positions(bitmask: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, token ids) of the set bits of xgrammar's packed bitmask [B, W] (bit j%32 of word j//32
    = token j), ids below `width` only, as `xgr.apply_token_bitmask_inplace` reads it.

    Reads only the nonzero words: the emoji grammar allows a handful of a vocabulary's 49K-248K ids.
    """
    rows, words = bitmask.nonzero(as_tuple=True)
    # `>>` on int32 copies bit 31 (the sign) down; `& 1` keeps only the bit shifted to position 0.
    hit, bit = ((bitmask[rows, words].unsqueeze(-1) >> _BITS) & 1).nonzero(as_tuple=True)
    ids = words[hit] * 32 + bit
    inside = ids < width
    return rows[hit][inside], ids[inside]


def mask_logits_(scores: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """In place: -inf wherever the (CPU) bitmask's bit is clear; `xgr.apply_token_bitmask_inplace`,
    cheaper when few tokens are allowed.

    xgrammar's CPU kernel tests every logit's bit: 4-13 ms a step at batch 16 on SmolLM2's 49K
    vocabulary (2 shared cores), ten times the grammar matchers' fill and accept. Copying out the few
    allowed logits, filling the rows with -inf and writing them back took 0.3-0.9 ms.
    """
    rows, ids = (t.to(scores.device) for t in allowed_positions(bitmask, scores.shape[-1]))
    kept = scores[rows, ids]
    scores.fill_(float("-inf"))
    scores[rows, ids] = kept
    return scores


def mask_logits_to_support_(
    scores: torch.Tensor, bitmask: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """In place: `mask_logits_` for a bitmask that allows ids of `support` (sorted int64 [S]) only,
    as the emoji grammar's does (`EmojiConstraint.support`). It reads S bits a row instead of
    searching the whole bitmask for set words, and the masking runs on the scores' device with
    nothing for the host to wait on: at 128 rows of Qwen3.5's 248,320 ids, the grammar's host work a
    step (the matchers' fill included) is 2.7 ms instead of 7.7 (`make bench-scale`)."""
    allowed = bits_at(bitmask, support).to(scores.device, non_blocking=True)
    columns = support.to(scores.device, non_blocking=True)
    kept = scores.index_select(-1, columns).masked_fill_(~allowed, float("-inf"))
    scores.fill_(float("-inf"))
    return scores.index_copy_(-1, columns, kept)


class EmojiLogitsProcessor(LogitsProcessor):
    """Masks to -inf every token the emoji grammar does not allow next, one matcher per batch row.

    For sampling or greedy decoding with any batch size and left padding (not beam search, which
    reorders rows). Use one instance per batch decoded: it learns the prompt length on its first
    call. A row that has sampled end of turn is allowed only end-of-turn ids from then on (decoding
    pads it anyway), so no row is ever all -inf. With `record_masks`, `applied_masks(row)` returns
    the masks applied to a row, to check against `replay_masks`.
    """

    def __init__(self, constraint: EmojiConstraint, record_masks: bool = False) -> None:
        self.constraint = constraint
        self.record_masks = record_masks
        self._matchers: list[xgr.GrammarMatcher] = []
        self._length = 0
        self._advanced = False
        self._bitmask = xgr.allocate_token_bitmask(1, constraint.vocab_size)
        stops = torch.tensor(constraint.stop_token_ids)
        self._ended_row = pack_bitmask(stops, constraint.vocab_size)
        # One (bitmask [B, W], row still in its message [B]) pair per step.
        self._recorded: list[tuple[torch.Tensor, list[bool]]] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch, length = input_ids.shape
        if not self._matchers:
            _check_width(scores, self.constraint.vocab_size)
            self._matchers = [self.constraint.matcher() for _ in range(batch)]
            self._bitmask = xgr.allocate_token_bitmask(batch, self.constraint.vocab_size)
        elif length != self._length + 1 or batch != len(self._matchers):
            raise RuntimeError(
                f"EmojiLogitsProcessor saw {len(self._matchers)} rows of length {self._length}, now "
                f"{batch} rows of length {length}: create a new processor for each batch decoded"
            )
        elif not self._advanced:
            self._accept(input_ids[:, -1].tolist())
        self._advanced = False
        self._length = length
        active = [not m.is_terminated() for m in self._matchers]
        # A Python loop: fill and accept took ~1 ms a step at batch 16, ~1% of a decode step, and
        # xgr.BatchGrammarMatcher measured no faster (its threads compete with torch's on 2 cores).
        for row, matcher in enumerate(self._matchers):
            if active[row]:
                matcher.fill_next_token_bitmask(self._bitmask, row)
            else:
                self._bitmask[row] = self._ended_row
        if self.record_masks:
            self._recorded.append((self._bitmask.clone(), active))
        return mask_logits_to_support_(scores, self._bitmask, self.constraint.support)

    def advance(self, sampled: Sequence[int]) -> None:
        """Accept the ids just sampled, one per row, as the host already holds them, so that the next
        call need not read them back from `input_ids`: on a GPU that read waits for the forward pass
        queued before the call, and the matchers' fill would follow it instead of running beside it."""
        self._accept(list(sampled))
        self._advanced = True

    def _accept(self, sampled: list[int]) -> None:
        for row, (matcher, token_id) in enumerate(zip(self._matchers, sampled, strict=True)):
            if not matcher.is_terminated() and not matcher.accept_token(token_id):
                raise RuntimeError(
                    f"row {row} sampled token {token_id}, which the emoji grammar had masked: something "
                    "after this processor changed the choice (beam search, or a processor passed after it)"
                )

    def applied_masks(self, row: int) -> torch.Tensor:
        """Bool [T, V]: the masks applied to `row` at each step until it sampled end of turn."""
        if not self.record_masks:
            raise RuntimeError("construct EmojiLogitsProcessor(..., record_masks=True) to keep its masks")
        words = [bitmask[row] for bitmask, active in self._recorded if active[row]]
        return unpack_bitmask(torch.stack(words), self.constraint.vocab_size)


def static_allowed_ids(
    tokenizer: PreTrainedTokenizerBase, stop_token_ids: Sequence[int] | None = None
) -> frozenset[int]:
    """The seed's bag of ids: every id in any alphabet emoji's tokenization, the space, end of turn.

    Any order of these ids is allowed, so byte fragments can combine into non-emoji characters and a
    message can end after zero emoji: the baseline the grammar is measured against.
    """
    encoded = tokenizer([*ALPHABET, SEPARATOR], add_special_tokens=False)["input_ids"]
    stops = end_of_turn_ids(tokenizer) if stop_token_ids is None else tuple(stop_token_ids)
    return frozenset(i for ids in encoded for i in ids) | frozenset(stops)


class StaticMaskLogitsProcessor(LogitsProcessor):
    """The seed's baseline: masks to -inf every id outside `static_allowed_ids`, whatever came before."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> None:
        self.allowed = torch.zeros(vocab_size or len(tokenizer), dtype=torch.bool)
        self.allowed[sorted(static_allowed_ids(tokenizer, stop_token_ids))] = True

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        _check_width(scores, self.allowed.shape[0])
        return scores.masked_fill(~self.allowed.to(scores.device), float("-inf"))


class PaddingMaskLogitsProcessor(LogitsProcessor):
    """Masks to -inf the ids at or above the tokenizer's length: the rows a model's LM head is padded
    with (Qwen3.5: 248,077 tokens, 248,320 logits), which no text decodes from. The grammar and the
    static mask allow none of them; sampling without either needs this (free-text games, a partner
    model, chat unconstrained)."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores[..., self.tokens :] = float("-inf")
        return scores
