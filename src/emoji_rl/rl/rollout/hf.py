"""In-process sampling: every live episode's turn decoded in one batch (`emoji_rl.generate`),
emoji-constrained by the grammar processor. Each row's KV cache is kept between turns, so a turn
reads only what the game wrote since the last one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from emoji_rl.beam import beam_search
from emoji_rl.generate import MAX_NEW_TOKENS, Constraint, generate_from_ids
from emoji_rl.rl.rollout.play import Sample

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class HFSampler:
    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        constraint: Constraint = "grammar",
        temperature: float = 1.0,
        max_new_tokens: int = MAX_NEW_TOKENS,
        batch_size: int = 64,
        min_emoji: int = 2,
        max_emoji: int = 8,
        num_beams: int = 1,
        guidance_scale: float = 1.0,
        unconditional: Sequence[int] = (),
    ) -> None:
        self.searches = num_beams > 1 or guidance_scale != 1.0
        if self.searches and (constraint != "grammar" or temperature > 0):
            raise ValueError(
                f"num_beams={num_beams}, guidance_scale={guidance_scale} look for the sender's best emoji "
                f"message: they need the grammar constraint and temperature 0 (got {constraint!r}, "
                f"temperature {temperature})"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.constraint: Constraint = constraint
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.min_emoji = min_emoji
        self.max_emoji = max_emoji
        self.num_beams = num_beams
        self.guidance_scale = guidance_scale
        self.unconditional = unconditional

    async def sample(
        self, prompts: Sequence[tuple[int, ...]], previous: Sequence[Sample | None] | None = None
    ) -> list[Sample]:
        if self.searches:  # no cache goes on to the next turn: it reads its prompt again
            replies = beam_search(
                self.model,
                self.tokenizer,
                prompts,
                self.num_beams,
                self.max_new_tokens,
                self.batch_size,
                self.min_emoji,
                self.max_emoji,
                self.guidance_scale,
                self.unconditional,
            )
            return [Sample(r.token_ids, r.logprobs, r.cache) for r in replies]
        replies = generate_from_ids(
            self.model,
            self.tokenizer,
            prompts,
            constraint=self.constraint,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size,
            min_emoji=self.min_emoji,
            max_emoji=self.max_emoji,
            caches=[p.resume if p is not None else None for p in previous] if previous is not None else None,
            keep_caches=True,
        )
        return [Sample(r.token_ids, r.logprobs, r.cache) for r in replies]
