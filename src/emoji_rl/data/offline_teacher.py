"""The offline teacher (docs/DESIGN.md §5): emoji answers for SFT data with no API key and no LLM.

For each message it retrieves emoji by MiniLM similarity between the message's content words and
two-word phrases and each emoji's names (`alphabet.keywords`), nudged by the whole message so that
a word takes the sense it has in context. Phrases are taken greedily, best match first, each
covering words no earlier pick covered, and an emoji too close to one already picked is skipped, so
an answer is neither one emoji repeated nor a run of near-synonyms. The answer keeps the message's
word order.

Stable API, used by the `teacher` stage of the data pipeline and by `judge-check`:

    teacher = OfflineTeacher(models.load_embedder())
    answers = teacher.answer(["My cat knocked the birthday cake off the table"])  # ["🐈 😵 🎂 🍰"]

Every answer passes `alphabet.parse_message`.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from emoji_rl.emoji.alphabet import ALPHABET, MAX_EMOJI, MIN_EMOJI, SEPARATOR, keywords, parse_message
from emoji_rl.emoji.stats import emoji_counts
from emoji_rl.lm import models

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

# Words that carry no picture. Pronouns, auxiliaries, articles, prepositions and chat fillers; words
# with a picture ("love", "lol", "home") stay.
STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing don down during each few for from further had has
    have having he her here hers herself him himself his how i if in into is it its itself just let
    lets me more most my myself no nor not now of off on once only or other our ours ourselves out
    over own same she should so some such than that the their theirs them themselves then there these
    they this those through to too under until up very was we were what when where which while who
    whom why will with would you your yours yourself yourselves im i'm i've i'll i'd it's let's can't
    don't didn't won't isn't wasn't aren't you're we're they're that's there's what's get got getting
    go going gonna want wanna like really maybe also still ever even well oh yeah yes ok okay hey
    much many lot lots one thing things something anything way back make made
    """.split()  # noqa: SIM905 (a word list reads better as text than as 190 quoted strings)
)
_WORD = re.compile(r"[A-Za-z][A-Za-z']*")
# Skin tones say nothing about a message; the 2,040 toned variants would double the embedding work.
_SKIN_TONE = re.compile("[\U0001f3fb-\U0001f3ff]")


@dataclass(frozen=True)
class _Query:
    text: str
    words: frozenset[int]
    """Positions of the content words this phrase stands for."""


def content_queries(message: str) -> list[_Query]:
    """Content words and two-word phrases of adjacent content words, in message order."""
    tokens = [t.lower() for t in _WORD.findall(message)]
    content = [(i, t) for i, t in enumerate(tokens) if t not in STOPWORDS and len(t) > 1]
    queries = [_Query(t, frozenset({i})) for i, t in content]
    for (i, a), (j, b) in itertools.pairwise(content):
        if j == i + 1:
            queries.append(_Query(f"{a} {b}", frozenset({i, j})))
    return sorted(queries, key=lambda q: min(q.words))


class OfflineTeacher:
    """Emoji answers by retrieval over emoji names; the name embeddings are computed once and cached."""

    def __init__(
        self,
        embedder: SentenceTransformer,
        min_emoji: int = MIN_EMOJI,
        max_emoji: int = MAX_EMOJI,
        context_weight: float = 0.5,
        min_score: float = 0.45,
        max_redundancy: float = 0.65,
        cache_dir: Path | None = None,
    ) -> None:
        """`context_weight`: how much the whole message counts beside a phrase when scoring an emoji.
        `min_score`: a phrase whose best emoji scores lower adds nothing (past `min_emoji`).
        `max_redundancy`: an emoji whose name is this similar to a picked one's is skipped."""
        assert 1 <= min_emoji <= max_emoji, (min_emoji, max_emoji)
        self.embedder = embedder
        self.min_emoji = min_emoji
        self.max_emoji = max_emoji
        self.context_weight = context_weight
        self.min_score = min_score
        self.max_redundancy = max_redundancy
        self.emoji = [e for e in ALPHABET if not _SKIN_TONE.search(e)]
        # Each emoji is matched by its best-matching name; `_owner[k]` is the emoji of name row k.
        names = [dict.fromkeys(k.lower() for k in keywords(e)) for e in self.emoji]
        self._owner = torch.tensor([i for i, ns in enumerate(names) for _ in ns])
        name_texts = [n for ns in names for n in ns]
        self._name_vecs = self._cached_embeddings(name_texts, cache_dir or models.cache_dir())
        first_rows = torch.tensor([0, *torch.cumsum(torch.tensor([len(ns) for ns in names]), 0)[:-1]])
        # Redundancy is judged on each emoji's main (CLDR) name.
        self._main_vecs = self._name_vecs[first_rows]
        self._vocabulary = torch.ones(len(self.emoji), dtype=torch.bool)

    def restrict(self, answers: Iterable[str], min_count: int) -> int:
        """From now on answer only with the emoji that `answers` (this teacher's own, unrestricted)
        use at least `min_count` times; returns how many emoji that keeps. A small sender learns an
        emoji from the examples that use it, and one seen a handful of times is never sent, so a
        teacher that spreads over 950 emoji teaches it less than one that keeps to those it can
        learn (docs/DESIGN.md §5)."""
        counts = emoji_counts([answer.split(SEPARATOR) for answer in answers])
        vocabulary = torch.tensor([counts[e] >= min_count for e in self.emoji])
        kept = int(vocabulary.sum())
        if kept < self.max_emoji:
            raise ValueError(
                f"min_count={min_count} keeps {kept} emoji, fewer than an answer may hold ({self.max_emoji}): lower it"
            )
        self._vocabulary = vocabulary
        return kept

    def answer(self, messages: list[str]) -> list[str]:
        """One emoji answer per message: `min_emoji`..`max_emoji` emoji joined by single spaces."""
        queries = [content_queries(m) for m in messages]
        flat = [q.text for qs in queries for q in qs]
        vecs = self._embed([*messages, *flat])
        message_vecs, query_vecs = vecs[: len(messages)], vecs[len(messages) :]
        answers = []
        offset = 0
        for m, qs in enumerate(queries):
            picked = self._pick(message_vecs[m], qs, query_vecs[offset : offset + len(qs)])
            offset += len(qs)
            answer = SEPARATOR.join(self.emoji[i] for i in picked)
            assert parse_message(answer, self.min_emoji, self.max_emoji).ok, (messages[m], answer)
            answers.append(answer)
        return answers

    def _scores(self, vecs: torch.Tensor) -> torch.Tensor:
        """Similarity of each row of `vecs` to each emoji, through the emoji's best name."""
        by_name = vecs @ self._name_vecs.T
        out = torch.full((len(vecs), len(self.emoji)), -1.0)
        index = self._owner.expand(len(vecs), -1)
        return out.scatter_reduce(1, index, by_name, reduce="amax")

    def _pick(self, message_vec: torch.Tensor, queries: list[_Query], query_vecs: torch.Tensor) -> list[int]:
        context = self.context_weight * self._scores(message_vec[None])[0]
        scores = (self._scores(query_vecs) + context) / (1 + self.context_weight)
        picks: list[tuple[int, int]] = []  # (position in the message, emoji index)
        covered: set[int] = set()
        allowed = self._vocabulary.clone()
        # Greedy over phrases: the best remaining (phrase, emoji) match first, one emoji per phrase.
        while len(picks) < self.max_emoji:
            open_rows = [r for r, q in enumerate(queries) if not q.words & covered]
            if not open_rows:
                break
            masked = scores[open_rows].masked_fill(~allowed, -2.0)
            best, row_best = masked.max(dim=1)
            r = int(best.argmax())
            if best[r] < self.min_score and len(picks) >= self.min_emoji:
                break
            query, e = queries[open_rows[r]], int(row_best[r])
            picks.append((min(query.words), e))
            covered |= query.words
            allowed &= self._main_vecs @ self._main_vecs[e] < self.max_redundancy
        chosen = [e for _, e in sorted(picks)]
        # Short messages ("Thanks so much!") get the rest from the whole message, still non-redundant.
        while len(chosen) < self.min_emoji:
            e = int(context.masked_fill(~allowed, -2.0).argmax())
            chosen.append(e)
            allowed &= self._main_vecs @ self._main_vecs[e] < self.max_redundancy
        return chosen

    def _embed(self, texts: list[str]) -> torch.Tensor:
        return self.embedder.encode(
            texts, batch_size=128, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        ).cpu()

    def _cached_embeddings(self, texts: list[str], cache_dir: Path) -> torch.Tensor:
        # The key covers the names (so the alphabet and the `emoji` package version) and the model. The
        # model is identified by what it computes: the embedding of a fixed probe, rounded, so another
        # model or a fine-tuned one at the same path never reuses stale vectors.
        probe = self._embed(["emoji-rl offline teacher probe"])[0][:16]
        key = hashlib.sha256("\n".join(texts).encode())
        key.update(str([round(float(v), 3) for v in probe]).encode())
        path = cache_dir / "offline-teacher" / f"names-{key.hexdigest()[:20]}.pt"
        if path.is_file():
            return torch.load(path, weights_only=True)
        log.info("embedding %d emoji names once; cached at %s", len(texts), path)
        vecs = self._embed(texts)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written beside the target and renamed: an interrupted run never leaves a truncated cache.
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
            torch.save(vecs, tmp.name)
        Path(tmp.name).replace(path)
        return vecs
