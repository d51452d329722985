"""Batched sampling from an in-process model, emoji-constrained or not: the one generation path that
chat, evaluation, data filtering and the hf rollout engine share.

Sampling is from the model's own distribution (no top-k / top-p), so what is sampled is what the
trainer later scores; the grammar mask, or without it the mask of the LM head's padding ids
(`template.padding_ids`), is the only change to the logits.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tqdm.auto import tqdm

from emoji_rl.decode.prefill import Prefilled, RowCache, continuable, cut_rows, prefill_inputs
from emoji_rl.emoji.alphabet import MAX_EMOJI, MIN_EMOJI
from emoji_rl.lm.models import at_least_fp32
from emoji_rl.lm.template import chat_ids, end_of_turn_ids, padding_ids, stop_token_id

if TYPE_CHECKING:
    import torch
    from transformers import LogitsProcessor, PreTrainedModel, PreTrainedTokenizerBase
    from transformers.cache_utils import Cache

Constraint = Literal["grammar", "static", "none"]
# Tokens for one emoji turn: 8 emoji take SmolLM2 up to ~72 tokens and Qwen3.5 a median of 60 (p99
# 95; an emoji is 7.7 Qwen3.5 tokens on average). A turn cut short is a format violation, and a row
# leaves the batch once it has ended, so a roomy budget costs little.
MAX_NEW_TOKENS = 96


@dataclass(frozen=True)
class Decoding:
    """How a model is sampled: what every sampler, `generate_from_ids` and `beam_search` read.

    `constraint`: the emoji grammar (between `min_emoji` and `max_emoji` emoji), the seed's static
    mask, or none (free text; the LM head's padding ids are still masked). `batch_size` rows are
    decoded together. `num_beams` > 1 or `guidance_scale` != 1 look for the sender's best message
    instead of sampling (`decode/beam.py`): under the grammar, at temperature 0. A reply ends at end
    of turn or at any of `stop_ids`, whose text it keeps (`ids_containing`)."""

    constraint: Constraint = "grammar"
    temperature: float = 1.0
    max_new_tokens: int = MAX_NEW_TOKENS
    batch_size: int = 16
    min_emoji: int = MIN_EMOJI
    max_emoji: int = MAX_EMOJI
    num_beams: int = 1
    guidance_scale: float = 1.0
    stop_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.num_beams < 1 or self.max_new_tokens < 0:
            raise ValueError(
                f"batch_size={self.batch_size} and num_beams={self.num_beams} must be >= 1, "
                f"max_new_tokens={self.max_new_tokens} >= 0"
            )
        if self.searches and (self.constraint != "grammar" or self.temperature > 0):
            raise ValueError(
                f"num_beams={self.num_beams}, guidance_scale={self.guidance_scale} look for the sender's best "
                f"emoji message: they need the grammar constraint and temperature 0 (got {self.constraint!r}, "
                f"temperature {self.temperature})"
            )

    @property
    def searches(self) -> bool:
        """Beam search or guidance rather than sampling."""
        return self.num_beams > 1 or self.guidance_scale != 1.0


@dataclass
class SamplingConfig:
    """How a stage samples the sender: temperature, a turn's token budget and the emoji count a valid
    message holds (docs/DESIGN.md §2)."""

    temperature: float = field(
        default=1.0, metadata={"help": "sender sampling temperature; 0 = greedy", "min": 0.0}
    )
    max_new_tokens: int = field(
        default=MAX_NEW_TOKENS, metadata={"help": "token budget of one sender turn", "min": 1}
    )
    min_emoji: int = field(default=MIN_EMOJI, metadata={"help": "fewest emoji in a valid message", "min": 1})
    max_emoji: int = field(default=MAX_EMOJI, metadata={"help": "most emoji in a valid message", "min": 1})

    def decoding(self, **more: Any) -> Decoding:
        """These fields as a sampler reads them, with `more` of `Decoding`'s (constraint, batch_size...)."""
        mine = {"temperature": self.temperature, "max_new_tokens": self.max_new_tokens}
        return Decoding(**{**mine, "min_emoji": self.min_emoji, "max_emoji": self.max_emoji, **more})


@dataclass(frozen=True)
class Reply:
    """One sampled reply: the ids as sampled (stop token included when the model stopped)."""

    text: str
    token_ids: tuple[int, ...]
    stopped: bool
    logprobs: tuple[float, ...]
    """Log-probs of `token_ids` under the distribution sampled from (temperature and mask applied)."""
    cache: RowCache | None = field(default=None, repr=False, compare=False)
    """The row's cache, to go on from in a next turn: with `keep_caches`, for models of full and linear
    attention layers (not sliding windows)."""


def make_processor(
    tokenizer: PreTrainedTokenizerBase, decoding: Decoding, vocab_size: int
) -> LogitsProcessor | None:
    from emoji_rl.decode import logits as emoji_logits
    from emoji_rl.emoji import constraint as emoji_constraint

    if decoding.constraint == "none":
        padding = padding_ids(tokenizer, vocab_size)
        return emoji_logits.PaddingMaskLogitsProcessor(padding.start) if padding else None
    if decoding.constraint == "static":
        return emoji_logits.StaticMaskLogitsProcessor(tokenizer, vocab_size)
    compiled = emoji_constraint.compile_emoji_grammar(
        tokenizer, decoding.min_emoji, decoding.max_emoji, vocab_size=vocab_size
    )
    return emoji_logits.EmojiLogitsProcessor(compiled)


def generate_from_ids(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Sequence[int]],
    decoding: Decoding = Decoding(),
    *,
    seed: int | None = None,
    progress: bool = False,
    caches: Sequence[RowCache | None] | None = None,
    keep_caches: bool = False,
) -> list[Reply]:
    """Sample one reply per prompt (token ids) as `decoding` says, `decoding.batch_size` prompts
    decoded together; a prefix that rows of a batch share is read once (`emoji_rl.decode.prefill`).
    `caches`, one per prompt, are the `Reply.cache`s of a previous call (`keep_caches`) whose rows
    these prompts go on from. A reply ends at end of turn (any of `end_of_turn_ids`, as on a vLLM
    server) or at any of `decoding.stop_ids`."""
    import torch

    if decoding.searches:
        raise ValueError(
            f"num_beams={decoding.num_beams}, guidance_scale={decoding.guidance_scale}: a search, not "
            "sampling (decode.beam.beam_search)"
        )
    stop_id = stop_token_id(tokenizer)
    turn_ends = frozenset(end_of_turn_ids(tokenizer))
    ends = turn_ends | decoding.stop_ids
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_id
    vocab_size = model.get_output_embeddings().weight.shape[0]
    if seed is not None:
        torch.manual_seed(seed)
    replies: list[Reply] = []
    device = next(model.parameters()).device
    size = decoding.batch_size
    for start in tqdm(range(0, len(prompts), size), desc="generate", unit="batch", disable=not progress):
        chunk = prompts[start : start + size]
        chunk_caches = caches[start : start + size] if caches is not None else None
        processor = make_processor(tokenizer, decoding, vocab_size)
        inputs = prefill_inputs(model, chunk, pad_id, chunk_caches).to(device)
        rows = decode(
            model, inputs, processor, decoding.temperature, decoding.max_new_tokens, ends, pad_id, keep_caches
        )
        replies += [make_reply(tokenizer, *row, turn_ends, ends) for row in rows]
    return replies


def decode(
    model: PreTrainedModel,
    inputs: Prefilled,
    processor: LogitsProcessor | None,
    temperature: float,
    max_new_tokens: int,
    stop_ids: Collection[int],
    pad_id: int,
    keep_caches: bool = False,
) -> list[tuple[list[int], list[float], RowCache | None]]:
    """Per row, the sampled ids (up to and including one of `stop_ids`, or `max_new_tokens` of them), their
    log-probs under the distribution each was drawn from (mask and temperature applied) and, with
    `keep_caches` and a `continuable` cache, the row's cache as it stopped.

    `inputs` are left-padded prompts, of which their cache already holds the first columns. A row
    leaves the batch and the KV cache as soon as it stops: HF `generate` would decode every row
    until the longest one ends, and on a CPU a decode step costs ~5 ms per row at batch 16.
    """
    import torch
    from transformers.cache_utils import DynamicCache

    ids, mask, cache = inputs
    batch = ids.shape[0]
    cache = DynamicCache(config=model.config) if cache is None else cache
    cached = cache.get_seq_length()
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logprobs: list[list[float]] = [[] for _ in range(batch)]
    row_caches: list[RowCache | None] = [None] * batch
    keep_caches = keep_caches and continuable(cache)
    stops = torch.tensor(sorted(stop_ids), device=ids.device)
    live = torch.arange(batch, device=ids.device)  # rows still writing, in the order of the cache's rows
    seen = ids  # every row's ids so far, stopped rows padded: what the processor reads
    step_ids = ids[:, cached:]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, cached:]

    def keep(live_positions: Sequence[int]) -> None:
        read = cache.get_seq_length()  # the columns read so far: the last token sampled is not
        cut = cut_rows(cache, seen[live, :read], mask[:, :read], live_positions)
        for position, row_cache in zip(live_positions, cut, strict=True):
            row_caches[int(live[position])] = row_cache

    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = step_logits(model, step_ids, mask, positions, cache)
            wide = at_least_fp32(logits)
            scores = wide.new_zeros(batch, logits.shape[-1])
            scores[live] = wide
            if processor is not None:  # a stopped row's scores only matter to keep its row well-formed
                scores = processor(seen, scores)
            chosen, chosen_logprobs = sample_tokens(scores[live], temperature)
            next_ids = torch.full((batch,), pad_id, dtype=ids.dtype, device=ids.device)
            next_ids[live] = chosen
            seen = torch.cat([seen, next_ids[:, None]], dim=1)
            sampled = [pad_id] * batch
            for row, token, logprob in zip(
                live.tolist(), chosen.tolist(), chosen_logprobs.tolist(), strict=True
            ):
                tokens[row].append(token)
                logprobs[row].append(logprob)
                sampled[row] = token
            if hasattr(processor, "advance"):  # the grammar's matchers, from these host ids
                processor.advance(sampled)
            going = ~torch.isin(chosen, stops)
            if keep_caches:
                keep((~going).nonzero().squeeze(1).tolist())
            if not going.any():
                break
            if not going.all():
                kept = going.nonzero().squeeze(1)
                cache.reorder_cache(kept)
                live, mask, chosen = live[kept], mask[kept], chosen[kept]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            step_ids, positions = chosen[:, None], mask.sum(-1, keepdim=True) - 1
        else:  # rows cut off by max_new_tokens
            if keep_caches and max_new_tokens > 0:
                keep(range(len(live)))
    return list(zip(tokens, logprobs, row_caches, strict=True))


def step_logits(
    model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Cache
) -> torch.Tensor:
    """[rows, V]: the next-token logits after `cache` reads `ids` at `positions` (`mask` covers every
    column so far): one step of a decode loop."""
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1]


def sample_tokens(scores: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, log-probs) drawn from softmax(scores / temperature) per row, or the argmax at 0.

    By inverse CDF: one uniform per row. `torch.multinomial` draws an exponential per vocabulary
    entry, 18 ms a step at batch 16 on SmolLM2's 49K ids (2 CPU cores), more than a decode step's
    attention. The probabilities are summed as integers, not floats: a float cumulative sum depends
    on the order of its additions, and CUDA's is a tree scan, so the sum at a masked id could land
    1 ulp above its predecessor's, catch u and be drawn. Integer sums are exact in any order: a
    masked id, weight 0, repeats its predecessor's sum, and the first sum that reaches u (in
    [1, total], so even at the ends) has a weight above zero.
    """
    import torch

    if temperature <= 0:
        ids = scores.argmax(-1)
        logp = scores.log_softmax(-1)
    else:
        logp = (scores / temperature).log_softmax(-1)
        # Weights in units of 2^-52: those rounded down to 0 hold under 1e-10 of the mass of a 250K
        # vocabulary, and the total stays below 2^53, where float64 is exact, so u never exceeds it.
        cumulative = logp.exp().mul_(2.0**52).long().cumsum_(-1)
        total = cumulative[:, -1:]
        r = torch.rand(len(scores), 1, dtype=torch.float64, device=scores.device)
        u = ((1 - r) * total).ceil().long()
        ids = torch.searchsorted(cumulative, u).squeeze(1)
    return ids, logp.gather(-1, ids[:, None]).squeeze(1)


def make_reply(
    tokenizer: PreTrainedTokenizerBase,
    ids: list[int],
    logprobs: list[float],
    cache: RowCache | None,
    turn_ends: Collection[int],
    ends: Collection[int],
) -> Reply:
    stopped = bool(ids) and ids[-1] in ends
    text_ids = ids[:-1] if stopped and ids[-1] in turn_ends else ids
    return Reply(
        tokenizer.decode(text_ids, skip_special_tokens=True), tuple(ids), stopped, tuple(logprobs), cache
    )


def ids_containing(tokenizer: PreTrainedTokenizerBase, characters: str) -> frozenset[int]:
    """The ids whose text holds any of `characters`: as stop ids, a reply ends with the first token
    that writes one, as HF `generate(stop_strings=...)` ends it for one-character strings."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return frozenset(i for i, text in enumerate(texts) if any(c in text for c in characters))


def generate_replies(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[list[dict[str, str]]],
    decoding: Decoding = Decoding(),
    **options: Any,
) -> list[Reply]:
    """Sample one assistant reply per chat, through the shared chat template; `options` are
    `generate_from_ids`'s."""
    prompts = [chat_ids(tokenizer, conversation) for conversation in conversations]
    return generate_from_ids(model, tokenizer, prompts, decoding, **options)
