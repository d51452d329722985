"""Where the `prompts` stage gets its messages: the chitchat corpus (offline) or Claude.

Each source returns a `Sample`: (text, category) pairs that passed the filters and deduplication, in
a stable order, with what was filtered and removed on the way.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import random
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from emoji_rl.data import claude
from emoji_rl.data.dedup import Deduper
from emoji_rl.data.jsonl import AppendLog, Record
from emoji_rl.data.text_filters import rejection_reason
from emoji_rl.errors import UserError

if TYPE_CHECKING:
    import anthropic

    from emoji_rl.data.prompts import Config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    messages: list[tuple[str, str]]
    """(text, category), in the order the source produced them."""
    filtered: Counter[str]
    """Messages rejected by `text_filters`, by reason."""
    duplicates: Counter[str]
    """Duplicates removed: `exact` and `near`."""
    examined: int
    """Messages looked at to make this sample."""


# ---------------------------------------------------------------- corpus


def corpus_texts() -> list[str]:
    """Every message of the chitchat-dataset package, whitespace collapsed, in the file's order."""
    # The package's classes open its 40 MB file without closing it and join the messages of a turn;
    # we want single messages, so read the file ourselves.
    spec = importlib.util.find_spec("chitchat_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the corpus source needs the PyPI package chitchat-dataset: `pip install chitchat-dataset`"
        )
    data = json.loads((Path(spec.submodule_search_locations[0]) / "dataset.json").read_text())
    return [" ".join(u["text"].split()) for conv in data.values() for turn in conv["messages"] for u in turn]


def sentence_type(text: str) -> str:
    """The category of a corpus message, read from its final punctuation."""
    return {"?": "question", "!": "exclamation"}.get(text.rstrip()[-1:], "statement")


def corpus_sample(cfg: Config, deduper: Deduper, texts: list[str]) -> Sample:
    """Up to `cfg.n` messages of `texts` in a seeded random order that pass the filters, deduplicated."""
    order = list(range(len(texts)))
    random.Random(cfg.seed).shuffle(order)
    filtered: Counter[str] = Counter()
    candidates: list[str] = []
    position = 0
    # Filter lazily in the shuffled order: the profanity regex costs ~0.2 ms a message, and 300
    # prompts need a few hundred candidates, not all 258K messages.
    wanted = cfg.n + cfg.n // 4
    while True:
        while len(candidates) < wanted and position < len(order):
            text = texts[order[position]]
            position += 1
            reason = rejection_reason(text, cfg.min_words, cfg.max_words)
            if reason is None:
                candidates.append(text)
            else:
                filtered[reason] += 1
        kept, duplicates = deduper.unique(candidates)
        if len(kept) >= cfg.n or position == len(order):
            break
        wanted += 2 * (cfg.n - len(kept))
    if len(kept) < cfg.n:
        log.warning("only %d messages pass the filters and deduplication, not %d", len(kept), cfg.n)
    messages = [(candidates[i], sentence_type(candidates[i])) for i in kept[: cfg.n]]
    return Sample(messages, filtered, duplicates, examined=position)


# ---------------------------------------------------------------- claude


@dataclass(frozen=True)
class Category:
    name: str
    weight: float
    description: str


# Seed 001 used 9 weighted categories; these follow DESIGN §4's list.
CATEGORIES: tuple[Category, ...] = (
    Category("everyday", 14, "small talk and updates about one's day, as sent to a friend"),
    Category("emotional", 14, "a message whose point is a feeling: joy, worry, grief, pride, boredom, love"),
    Category("plans", 12, "plans, invitations and logistics: meeting up, trips, errands, deadlines"),
    Category("factual", 12, "a plain statement of fact about the world, science, history or nature"),
    Category(
        "descriptive", 12, "a description of a scene, a place, an object, someone's look or the weather"
    ),
    Category("questions", 12, "a question one person asks another"),
    Category("news", 8, "personal news: a new job, a move, a birth, an illness, an exam result"),
    Category("idioms", 8, "a message built around an idiom or a figure of speech"),
    Category(
        "edge cases", 8, "hard to say in emoji: abstract ideas, negation, numbers and times, sarcasm, ifs"
    ),
)
# Each request gets a theme, so that requests of one category do not all write the same messages.
TOPICS = (
    "food and cooking", "travel", "work", "school", "family", "pets", "sports", "weather", "health",
    "music", "technology", "money", "holidays", "nature", "science", "movies and TV", "friendship",
    "home", "shopping", "cars and commuting", "books", "art", "the ocean", "city life", "childhood",
    "games", "the night sky", "gardening", "fitness", "celebrations", "history", "animals in the wild",
    "cleaning", "sleep", "coffee", "birthdays", "rain", "winter", "summer", "neighbours",
)  # fmt: skip
_SCHEMA = {
    "type": "object",
    "properties": {"messages": {"type": "array", "items": {"type": "string"}}},
    "required": ["messages"],
    "additionalProperties": False,
}
# Claude writes more than is missing: some messages fail the filters or turn out to be duplicates.
_OVERSHOOT = 1.25


def quotas(n: int, categories: tuple[Category, ...] = CATEGORIES) -> dict[str, int]:
    """`n` split by weight with largest remainders, so that the counts sum to exactly `n`."""
    total = sum(c.weight for c in categories)
    exact = {c.name: n * c.weight / total for c in categories}
    counts = {name: int(x) for name, x in exact.items()}
    for name in sorted(exact, key=lambda k: counts[k] - exact[k])[: n - sum(counts.values())]:
        counts[name] += 1
    return counts


def request_params(cfg: Config, category: Category, index: int) -> dict[str, object]:
    """The Messages API request for the `index`-th set of messages of a category."""
    topic = random.Random(f"{cfg.seed}/{category.name}/{index}").choice(TOPICS)
    instruction = (
        f"Write {cfg.per_request} different messages that a person might send in a chat. "
        f"Category: {category.name} ({category.description}). Theme of this set: {topic}.\n"
        f"Each message is {cfg.min_words} to {cfg.max_words} words of everyday English, makes sense on "
        "its own, and differs from the others in wording and tone. No emoji, no names of real private "
        "people, no email addresses, phone numbers, handles or links."
    )
    return {
        "model": cfg.model,
        "max_tokens": 64 * cfg.per_request + 256,
        "messages": [{"role": "user", "content": instruction}],
        "output_config": {"format": {"type": "json_schema", "schema": _SCHEMA}},
    }


def parse_reply(text: str) -> list[str] | None:
    """The messages of a reply, whitespace collapsed, or None when it is not the JSON asked for."""
    try:
        messages = json.loads(text)["messages"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(messages, list):
        return None
    return [" ".join(m.split()) for m in messages if isinstance(m, str)]


def raw_path(out: str | Path) -> Path:
    """Every message Claude sent, one record per line: {"text", "category", "request"}."""
    out = Path(out)
    return out.with_name(out.stem + ".raw.jsonl")


def _select(records: list[Record], want: dict[str, int], cfg: Config, deduper: Deduper) -> Sample:
    """Filter and deduplicate everything received so far; take each category's first `want` messages."""
    filtered: Counter[str] = Counter()
    passing: list[tuple[str, str]] = []
    for r in records:
        reason = rejection_reason(r["text"], cfg.min_words, cfg.max_words)
        if reason is None:
            passing.append((r["text"], r["category"]))
        else:
            filtered[reason] += 1
    kept, duplicates = deduper.unique([text for text, _ in passing])
    taken: Counter[str] = Counter()
    messages = []
    for text, category in (passing[i] for i in kept):
        if taken[category] < want.get(category, 0):
            taken[category] += 1
            messages.append((text, category))
    return Sample(messages, filtered, duplicates, examined=len(records))


def _ask(client: anthropic.Anthropic, params: dict[str, object]) -> list[str] | None:
    return parse_reply(claude.message_text(client.messages.create(**params)))  # type: ignore[call-overload]


def _run_requests(
    client: anthropic.Anthropic, cfg: Config, jobs: list[tuple[Category, int]], raw: AppendLog
) -> None:
    """Send the requests `cfg.concurrency` at a time; append each reply's messages as it arrives."""
    failed = unparseable = 0
    with ThreadPoolExecutor(cfg.concurrency) as pool:
        futures: dict[Future[list[str] | None], tuple[Category, int]] = {
            pool.submit(_ask, client, request_params(cfg, category, index)): (category, index)
            for category, index in jobs
        }
        for future in tqdm(as_completed(futures), total=len(futures), desc="claude requests", unit="req"):
            category, index = futures[future]
            try:
                messages = future.result()
            except Exception as err:
                if not claude.is_transient(err):
                    for other in futures:
                        other.cancel()
                    raise claude.fatal(err, "a prompts request") from err
                log.warning(
                    "request %s #%d failed after retries: %s", category.name, index, claude.describe(err)
                )
                failed += 1
                continue
            if messages is None:
                unparseable += 1
                continue
            for text in messages:
                raw.append({"text": text, "category": category.name, "request": index})
    if unparseable:
        log.warning("%d of %d replies were not the JSON asked for", unparseable, len(jobs))
    if failed == len(jobs):
        raise UserError(f"all {failed} prompt requests failed (see the warnings above); rerun to resume")


def claude_sample(cfg: Config, client: anthropic.Anthropic, deduper: Deduper) -> Sample:
    """Messages per category in proportion to `CATEGORIES`' weights. What is already in the raw log
    counts, so a rerun asks only for what is missing."""
    want = quotas(cfg.n)
    with AppendLog(raw_path(cfg.out)) as raw:
        if raw.records:
            log.info("resuming: %s already holds %d messages", raw.path, len(raw.records))
        sample = _select(raw.records, want, cfg, deduper)
        for round_ in range(1, cfg.max_rounds + 1):
            have = Counter(category for _, category in sample.messages)
            missing = {c: want[c.name] - have[c.name] for c in CATEGORIES if have[c.name] < want[c.name]}
            if not missing:
                break
            next_index = Counter()
            for r in raw.records:
                next_index[r["category"]] = max(next_index[r["category"]], r["request"] + 1)
            jobs = [
                (c, next_index[c.name] + k)
                for c, short in missing.items()
                for k in range(math.ceil(short * _OVERSHOOT / cfg.per_request))
            ]
            log.info("round %d: %d messages missing, %d requests", round_, sum(missing.values()), len(jobs))
            _run_requests(client, cfg, jobs, raw)
            sample = _select(raw.records, want, cfg, deduper)
    if len(sample.messages) < cfg.n:
        log.warning(
            "%d of %d messages after %d rounds (duplicates and filters ate the rest): rerun to add more",
            len(sample.messages), cfg.n, cfg.max_rounds,
        )  # fmt: skip
    return sample
