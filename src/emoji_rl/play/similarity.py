"""How close a text comes to a message: MiniLM cosine similarity (docs/DESIGN.md §3), which the games
that guess messages score with (the retrieval game's judge, the reader); retrieval@1, which asks
whether a guess is closer to its own target than to any other; and how well a guess fits messages in
general (`Background`), which a contrast term charges (`ContrastConfig`: its weight and sample); and
both for concurrent games (`GuessScorer`).

A stage builds the similarity once, one way (`load_similarity`, or its config's `load_similarity`),
and passes it in; the scoring functions do no I/O and read no config.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from emoji_rl.config import Checked
from emoji_rl.lm.models import MINILM
from emoji_rl.play.batching import MicroBatcher

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from emoji_rl.lm.models import Runtime


@dataclass
class SimilarityConfig:
    """The sentence embedder that scores a guess against its message, in every stage that scores one."""

    similarity_model: str = field(
        default=MINILM,
        metadata={
            "help": "sentence embedder spec that scores a guess against its message (the reward's)",
            "aliases": ("embedder",),
        },
    )

    def load_similarity(self, runtime: Runtime | None = None) -> Similarity:
        """The similarity `similarity_model` names, on `runtime`'s device (the CPU without one)."""
        return load_similarity(self.similarity_model, runtime)


class Similarity:
    """Batched cosine similarity of sentence embeddings; each distinct text is embedded once per call."""

    def __init__(self, embedder: SentenceTransformer, batch_size: int = 64) -> None:
        self.embedder = embedder
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit-norm embeddings, one row per text (shape `[len(texts), dim]`)."""
        if not texts:
            return torch.zeros(0, self.embedder.get_embedding_dimension())
        # GRPO scores G rollouts of one target, turn after turn: embed each distinct text once.
        unique = list(dict.fromkeys(texts))
        vectors = self.embedder.encode(
            unique,
            batch_size=self.batch_size,
            convert_to_tensor=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        ).cpu()
        row = {text: i for i, text in enumerate(unique)}
        return vectors[[row[t] for t in texts]]

    def similarity(self, targets: Sequence[str], guesses: Sequence[str]) -> list[float]:
        """Cosine similarity of each target with the guess at the same index."""
        assert len(targets) == len(guesses), (len(targets), len(guesses))
        if not targets:
            return []
        vectors = self.embed([*targets, *guesses])
        target_vecs, guess_vecs = vectors[: len(targets)], vectors[len(targets) :]
        return (target_vecs * guess_vecs).sum(dim=1).tolist()

    def retrieval_at_1(self, targets: Sequence[str], guesses: Sequence[str]) -> float:
        """The fraction of guesses whose own target is the nearest of all `targets` (guess i <-> target i)."""
        assert len(targets) == len(guesses), (len(targets), len(guesses))
        vectors = self.embed([*targets, *guesses])
        return retrieval_at_1(vectors[: len(targets)], vectors[len(targets) :])


def load_similarity(spec: str = MINILM, runtime: Runtime | None = None) -> Similarity:
    """The one way a stage builds a similarity: the sentence embedder `spec` names (`models`'s specs),
    loaded on `runtime`'s device (the CPU without one)."""
    from emoji_rl.lm import models

    return Similarity(models.load_embedder(spec, device=runtime.device if runtime else None))


def retrieval_at_1(target_vecs: torch.Tensor, guess_vecs: torch.Tensor) -> float:
    """The fraction of rows i where target i is the most similar target to guess i.

    Unit-norm rows in. A tie with another target (a duplicate message) counts as a miss: the guess
    did not single out its own target.
    """
    assert target_vecs.shape == guess_vecs.shape, (target_vecs.shape, guess_vecs.shape)
    if len(target_vecs) == 0:
        return 0.0
    scores = guess_vecs @ target_vecs.T
    own = scores.diagonal()
    others = scores.clone()
    others.fill_diagonal_(float("-inf"))
    return (own > others.max(dim=1).values).float().mean().item()


def mean_similarity(
    guess_vecs: torch.Tensor, reference_vecs: torch.Tensor, skip: torch.Tensor
) -> torch.Tensor:
    """Row i: the mean cosine similarity of guess i to the references not skipped for it.

    Unit-norm rows in (`[N, D]`, `[K, D]`); `skip` is `[N, K]`, True where a reference is guess i's own
    target (comparing a guess with its own target is the similarity term's job). A row that skips
    every reference is 0."""
    keep = (~skip).to(guess_vecs.dtype)
    total = ((guess_vecs @ reference_vecs.T) * keep).sum(dim=1)
    return total / keep.sum(dim=1).clamp(min=1.0)


class Background:
    """How well a guess would fit messages in general: its mean similarity to a fixed sample of other
    messages. The judge's stock sentence for an emoji pair that a sender writes whatever the target
    ("I'm a student...") scores about as high here as against its own target; a guess that carries this
    message's content scores low."""

    def __init__(self, similarity: Similarity, messages: Sequence[str]) -> None:
        if not messages:
            raise ValueError("Background needs at least one message")
        self.similarity = similarity
        self.messages = list(dict.fromkeys(messages))
        self.vectors = similarity.embed(self.messages)

    def score(self, targets: Sequence[str], guesses: Sequence[str]) -> list[float]:
        """The mean similarity of each guess to the sample, its own target left out."""
        assert len(targets) == len(guesses), (len(targets), len(guesses))
        if not guesses:
            return []
        skip = torch.tensor([[message == target for message in self.messages] for target in targets])
        return mean_similarity(self.similarity.embed(guesses), self.vectors, skip).tolist()


class GuessScorer:
    """`await scorer((target, guess))` -> (similarity, background: 0 without a `Background`), shared by
    every game of a run: the pairs awaited in one event-loop pass are embedded in one call
    (`MicroBatcher`), so the B x G games of a step make one embedding call per turn."""

    def __init__(self, similarity: Similarity, background: Background | None = None) -> None:
        self.similarity = similarity
        self.background = background
        self.seconds = 0.0
        """Spent scoring since the start (a step's share is logged as `time/...`)."""
        self._batcher: MicroBatcher[tuple[str, str], tuple[float, float]] = MicroBatcher(self._score)

    async def __call__(self, pair: tuple[str, str]) -> tuple[float, float]:
        return await self._batcher(pair)

    @property
    def batch_sizes(self) -> list[int]:
        """The pairs of each embedding call so far, in order."""
        return self._batcher.batch_sizes

    async def _score(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, float]]:
        start = time.perf_counter()
        targets, guesses = [t for t, _ in pairs], [g for _, g in pairs]
        scores = self.similarity.similarity(targets, guesses)
        backgrounds = self.background.score(targets, guesses) if self.background else [0.0] * len(pairs)
        self.seconds += time.perf_counter() - start
        return list(zip(scores, backgrounds, strict=True))


@dataclass
class ContrastConfig(Checked):
    """The contrast term of a game whose guess is scored against its message (docs/DESIGN.md §3): its
    weight, and how many training messages measure how generic a guess is."""

    contrast: float = field(
        default=0.0,
        metadata={
            "help": "times the final guess's mean similarity to contrast_messages other training targets, "
            "subtracted: a guess that fits any message earns no more than one that fits none (0: off; the "
            "original had none)"
        },
    )
    contrast_messages: int = field(
        default=64, metadata={"help": "training targets drawn (seeded) to measure how generic a guess is"}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.contrast < 0 or self.contrast_messages < 1:
            raise ValueError(
                f"contrast={self.contrast} must be >= 0 and contrast_messages={self.contrast_messages} >= 1"
            )

    def background(self, similarity: Similarity, targets: Sequence[str], seed: int) -> Background | None:
        """The sample a guess's background is measured on: contrast_messages of `targets`, drawn with
        `seed` (the run's, so a resume draws the same); None when the term is off."""
        if self.contrast == 0:
            return None
        return Background(
            similarity, random.Random(seed).sample(list(targets), min(self.contrast_messages, len(targets)))
        )
