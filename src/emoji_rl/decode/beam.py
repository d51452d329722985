"""The sender's best emoji message rather than its likeliest next token: beam search under the emoji
grammar, and classifier-free guidance, each at temperature 0 (a way to read the sender; training
samples as before). docs/DESIGN.md §2 has what each measured.

A byte-level vocabulary writes most emoji as three or more tokens: SmolLM2 spells 👉 as the bytes
F0 9F, 91, 89, and the third byte picks one of 64 neighbouring code points. Greedy decoding takes
the likeliest byte at each step, so it picks the Unicode block that holds the most probability in
all, then the likeliest emoji inside it. Beam search scores whole messages instead. Guidance scores
each token by how much more likely the message makes it than an empty message does, discounting the
emoji a sender writes whatever it is told.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from emoji_rl.decode.generate import Decoding, Reply, make_reply, step_logits
from emoji_rl.decode.prefill import prefill_inputs
from emoji_rl.lm.models import at_least_fp32
from emoji_rl.lm.template import end_of_turn_ids, stop_token_id

if TYPE_CHECKING:
    import torch
    import xgrammar as xgr
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from emoji_rl.emoji.constraint import EmojiConstraint


@dataclass
class Beam:
    prompt: int
    """Index of the prompt this beam answers."""
    tokens: list[int]
    logprobs: list[float]
    score: float
    """Sum of `logprobs`: the log-probability of the message so far under the masked model."""
    matcher: xgr.GrammarMatcher


def best_candidates(
    beams: Sequence[Beam], logprobs: torch.Tensor, width: int, ends: frozenset[int]
) -> tuple[list[tuple[int, int, float]], tuple[int, int, float] | None]:
    """One prompt's next beams, as (row in `beams`, token, score): the `width` highest-scoring
    continuations that do not end the message, best first, and the best one that does (or None).

    `logprobs` [rows, V] are each beam's next-token log-probs, -inf where the grammar forbids.
    Enough candidates are taken that `width` of them can go on even if the best ones all end.
    """
    import torch

    totals = torch.tensor([b.score for b in beams], dtype=logprobs.dtype)[:, None] + logprobs
    flat = totals.flatten()
    k = min(width * (len(ends) + 1), int(torch.isfinite(flat).sum()))
    scores, positions = flat.topk(k)
    going: list[tuple[int, int, float]] = []
    ended: tuple[int, int, float] | None = None
    vocab = logprobs.shape[1]
    for score, position in zip(scores.tolist(), positions.tolist(), strict=True):
        row, token = divmod(position, vocab)
        if token in ends:
            ended = ended or (row, token, score)
        elif len(going) < width:
            going.append((row, token, score))
    return going, ended


def beam_search(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Sequence[int]],
    decoding: Decoding,
    unconditional: Sequence[int] = (),
    progress: bool = False,
) -> list[Reply]:
    """The highest-scoring emoji message per prompt (token ids) that `decoding.num_beams` beams find,
    scored by its log-probability under the grammar-masked model (temperature 1, no length penalty).
    About `decoding.batch_size` rows are decoded together (`batch_size // num_beams` prompts at a time).

    A prompt is done when its best ended message scores at least as well as every beam still going:
    a log-probability only falls as a message grows, so no beam could overtake it. A prompt with no
    ended message after `max_new_tokens` returns its best beam, not stopped (a format violation, as
    a greedy row cut short is). `Reply.logprobs` are each token's log-prob under the masked model
    (with guidance, the guided one: what the score sums).

    With `guidance_scale` g != 1 (classifier-free guidance), each token is scored by u + g (c - u) where c
    and u are the masked log-probs given the prompt and given `unconditional` (the same chat with no
    message), renormalized: g > 1 takes away what the sender would write whatever the message was.
    `decoding` asks for the grammar at temperature 0, as any search does (`Decoding`).
    """
    from emoji_rl.emoji.constraint import compile_emoji_grammar

    if decoding.constraint != "grammar" or decoding.temperature > 0 or decoding.stop_ids:
        raise ValueError(
            f"beam search finds the best emoji message: it needs the grammar at temperature 0 and no "
            f"stop_ids (got {decoding.constraint!r}, temperature {decoding.temperature}, "
            f"{len(decoding.stop_ids)} stop ids)"
        )
    vocab_size = model.get_output_embeddings().weight.shape[0]
    constraint = compile_emoji_grammar(
        tokenizer, decoding.min_emoji, decoding.max_emoji, vocab_size=vocab_size
    )
    turn_ends = frozenset(end_of_turn_ids(tokenizer))
    stop_id = stop_token_id(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_id
    per_chunk = max(1, decoding.batch_size // decoding.num_beams)
    replies: list[Reply] = []
    starts = range(0, len(prompts), per_chunk)
    for start in tqdm(starts, desc="beam search", unit="batch", disable=not progress):
        chunk = prompts[start : start + per_chunk]
        found = _search(model, chunk, constraint, decoding, turn_ends, pad_id, unconditional)
        replies += [make_reply(tokenizer, b.tokens, b.logprobs, None, turn_ends, turn_ends) for b in found]
    return replies


def _search(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    constraint: EmojiConstraint,
    decoding: Decoding,
    ends: frozenset[int],
    pad_id: int,
    unconditional: Sequence[int],
) -> list[Beam]:
    import torch
    import xgrammar as xgr
    from transformers.cache_utils import DynamicCache

    from emoji_rl.decode.logits import mask_logits_

    device = next(model.parameters()).device
    num_beams, guidance_scale = decoding.num_beams, decoding.guidance_scale
    guided = guidance_scale != 1.0
    if guided and not unconditional:
        raise ValueError(f"guidance_scale={guidance_scale} needs the unconditional prompt's ids")
    # Guided, every beam has a twin row after all the beams: the unconditional prompt, the same tokens.
    twins = [unconditional] * len(prompts) if guided else []
    ids, mask, cache = prefill_inputs(model, [*prompts, *twins], pad_id)
    cache = DynamicCache(config=model.config) if cache is None else cache
    cached = cache.get_seq_length()
    step_ids = ids[:, cached:].to(device)
    mask = mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, cached:]
    beams = [Beam(p, [], [], 0.0, constraint.matcher()) for p in range(len(prompts))]
    best: dict[int, Beam] = {}  # per prompt, the best message that ended
    with torch.no_grad():
        for _ in range(decoding.max_new_tokens):
            scores = at_least_fp32(step_logits(model, step_ids, mask, positions, cache)).cpu()
            bitmask = xgr.allocate_token_bitmask(len(beams), constraint.vocab_size)
            for row, beam in enumerate(beams):
                beam.matcher.fill_next_token_bitmask(bitmask, row)
            logprobs = mask_logits_(scores[: len(beams)], bitmask).log_softmax(-1)
            if guided:
                twin = mask_logits_(scores[len(beams) :], bitmask).log_softmax(-1)
                logprobs = guide(logprobs, twin, guidance_scale)
            kept: list[int] = []
            following: list[Beam] = []
            rows_of: dict[int, list[int]] = {}
            for row, beam in enumerate(beams):
                rows_of.setdefault(beam.prompt, []).append(row)
            for prompt, rows in sorted(rows_of.items()):
                going, ended = best_candidates([beams[r] for r in rows], logprobs[rows], num_beams, ends)
                if ended is not None and (prompt not in best or ended[2] > best[prompt].score):
                    source = beams[rows[ended[0]]]
                    best[prompt] = _extend(source, ended[1], ended[2], logprobs[rows[ended[0]]], fork=False)
                if not going or (prompt in best and best[prompt].score >= going[0][2]):
                    continue  # done
                for row, token, score in going:
                    source = beams[rows[row]]
                    beam = _extend(source, token, score, logprobs[rows[row]], fork=True)
                    if not beam.matcher.accept_token(token):
                        raise RuntimeError(
                            f"beam search chose token {token}, which the emoji grammar forbids"
                        )
                    kept.append(rows[row])
                    following.append(beam)
            if not following:
                break
            twin_rows = [len(beams) + row for row in kept] if guided else []
            index = torch.tensor(kept + twin_rows, device=device)
            cache.reorder_cache(index)
            beams = following
            mask = torch.cat([mask[index], mask.new_ones(len(index), 1)], dim=1)
            chosen = [beam.tokens[-1] for beam in beams]
            step_ids = torch.tensor(chosen + chosen * guided, device=device)[:, None]  # twins: the same
            positions = mask.sum(-1, keepdim=True) - 1
    for beam in beams:  # cut off by max_new_tokens with no message ended: its best beam, listed first
        best.setdefault(beam.prompt, beam)
    return [best[p] for p in range(len(prompts))]


def guide(conditional: torch.Tensor, unconditional: torch.Tensor, scale: float) -> torch.Tensor:
    """Log-probs of u + scale (c - u), renormalized, from masked log-probs c and u (-inf alike where
    the grammar forbids, which stays -inf)."""
    import torch

    allowed = torch.isfinite(conditional)
    mixed = unconditional + scale * (conditional - unconditional)
    return torch.where(allowed, mixed, float("-inf")).log_softmax(-1)


def _extend(source: Beam, token: int, score: float, logprobs: torch.Tensor, fork: bool) -> Beam:
    return Beam(
        source.prompt,
        [*source.tokens, token],
        [*source.logprobs, float(logprobs[token])],
        score,
        source.matcher.fork() if fork else source.matcher,
    )
