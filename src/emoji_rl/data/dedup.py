"""Exact and near-duplicate removal of messages, keeping the first occurrence of each.

Exact duplicates compare `normalize(text)` (case, punctuation and spacing ignored). Near duplicates
compare MiniLM embeddings: a message whose cosine similarity to an earlier kept one is at least the
threshold is dropped ("How are you doing today?" / "how are you doing today").
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

_WORD = re.compile(r"[\w']+")
# Rows compared at once: a 1024 x 1024 float block is 4 MB, and 30K prompts take well under a second.
_BLOCK = 1024


def normalize(text: str) -> str:
    """The form two exact duplicates share: lower case, words only, single spaces."""
    return " ".join(_WORD.findall(text.casefold()))


def exact_unique(texts: list[str]) -> list[int]:
    """Indices of the first occurrence of each normalized text, in order."""
    seen: set[str] = set()
    keep = []
    for i, text in enumerate(texts):
        key = normalize(text)
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return keep


def near_unique(vecs_N_D: torch.Tensor, threshold: float) -> list[int]:
    """Indices of rows (unit vectors) kept greedily in order: a row is dropped when its cosine
    similarity to an earlier kept row is >= `threshold`."""
    kept: list[torch.Tensor] = []
    keep: list[int] = []
    for start in range(0, len(vecs_N_D), _BLOCK):
        block = vecs_N_D[start : start + _BLOCK]
        drop = torch.zeros(len(block), dtype=torch.bool)
        for earlier in kept:
            drop |= (block @ earlier.T).max(dim=1).values >= threshold
        sims = block @ block.T
        later = torch.ones_like(sims, dtype=torch.bool).triu(diagonal=1)
        chosen = []
        for i in range(len(block)):
            if not drop[i]:
                chosen.append(i)
                drop |= (sims[i] >= threshold) & later[i]
        keep.extend(start + i for i in chosen)
        kept.append(block[chosen])
    return keep


def embed(embedder: SentenceTransformer, texts: list[str], show_progress: bool = False) -> torch.Tensor:
    """Unit-norm MiniLM embeddings on the CPU, one row per text."""
    return embedder.encode(
        texts,
        batch_size=128,
        convert_to_tensor=True,
        normalize_embeddings=True,
        show_progress_bar=show_progress,
    ).cpu()


class Deduper:
    """Exact, then near-duplicate removal; embeddings are cached, so redoing a growing list is cheap."""

    def __init__(self, embedder: SentenceTransformer, threshold: float) -> None:
        self.embedder, self.threshold = embedder, threshold
        self._vecs: dict[str, torch.Tensor] = {}

    def unique(self, texts: list[str]) -> tuple[list[int], Counter[str]]:
        """Indices of the texts kept, in order, and the number of duplicates removed by kind."""
        exact = exact_unique(texts)
        new = [t for t in dict.fromkeys(texts[i] for i in exact) if t not in self._vecs]
        if new:
            self._vecs.update(zip(new, embed(self.embedder, new, show_progress=len(new) > 1000), strict=True))
        if not exact:
            return [], Counter()
        vecs = torch.stack([self._vecs[texts[i]] for i in exact])
        kept = [exact[i] for i in near_unique(vecs, self.threshold)]
        return kept, Counter(exact=len(texts) - len(exact), near=len(exact) - len(kept))
