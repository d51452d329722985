"""In-process sampling with `transformers.generate`: every live episode's turn in one batched call,
emoji-constrained by the grammar processor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

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
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.constraint: Constraint = constraint
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.min_emoji = min_emoji
        self.max_emoji = max_emoji

    async def sample(self, prompts: Sequence[tuple[int, ...]]) -> list[Sample]:
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
            return_logprobs=True,
        )
        return [Sample(r.token_ids, r.logprobs) for r in replies]
