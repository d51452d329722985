"""What a sampler is (`Sample`, `Sampler`; the vLLM engine in `decode/vllm.py` is the other one),
and in-process sampling: every live episode's turn decoded in one batch (`decode/generate.py`),
emoji-constrained by the grammar processor. Each row's KV cache is kept between turns, so a turn
reads only what the game wrote since the last one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from emoji_rl.decode.beam import beam_search
from emoji_rl.decode.generate import Constraint, Decoding, generate_from_ids

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class Sample:
    """One sampled turn: ids as sampled (stop token included) and their log-probs under the
    distribution the sampler drew from (grammar-masked, temperature applied)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    resume: Any = field(default=None, repr=False, compare=False)
    """What the sampler can go on from in the episode's next turn instead of reading it all again
    (the hf engine's KV cache of the row), or None."""
    version: int | None = None
    """The adapter version that sampled it (the trainer step that published it, on a vLLM server);
    None: the weights being trained, in-process."""


class Sampler(Protocol):
    async def sample(
        self,
        prompts: Sequence[tuple[int, ...]],
        previous: Sequence[Sample | None] | None = None,
        *,
        constraint: Constraint | None = None,
    ) -> list[Sample]:
        """One sample per prompt (a whole episode so far, as token ids), in order. `previous` is, per
        prompt, the episode's sample of the turn before (None on its first turn). `constraint`: how
        these prompts' turns are sampled (a seat's, when a game seats the policy in several chats);
        None: as the sampler is set."""
        ...


class HFSampler:
    """In-process sampling as `decoding` says (a search with `decoding.searches`, against the
    `unconditional` prompt's ids under guidance)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        decoding: Decoding,
        unconditional: Sequence[int] = (),
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.decoding = decoding
        self.unconditional = unconditional

    async def sample(
        self,
        prompts: Sequence[tuple[int, ...]],
        previous: Sequence[Sample | None] | None = None,
        *,
        constraint: Constraint | None = None,
    ) -> list[Sample]:
        decoding = self.decoding if constraint is None else replace(self.decoding, constraint=constraint)
        if decoding.searches:  # no cache goes on to the next turn: it reads its prompt again
            replies = beam_search(self.model, self.tokenizer, prompts, decoding, self.unconditional)
            return [Sample(r.token_ids, r.logprobs, r.cache) for r in replies]
        replies = generate_from_ids(
            self.model,
            self.tokenizer,
            prompts,
            decoding,
            caches=[p.resume if p is not None else None for p in previous] if previous is not None else None,
            keep_caches=True,
        )
        return [Sample(r.token_ids, r.logprobs, r.cache) for r in replies]
