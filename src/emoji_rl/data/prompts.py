"""`emoji-rl prompts`: the natural-language messages the sender learns to say in emoji (docs/DESIGN.md §5).

Sources:
- `corpus` (offline, the cpu default): real chat messages from the PyPI package `chitchat-dataset`
  (MIT; 258K messages in 7,168 conversations), read from the JSON file inside the package, one
  message per line a person typed. About 140K pass the filters; a seeded sample of them is used.
- `claude`: the Anthropic API writes messages in weighted categories (`CATEGORIES`), each request
  themed by a topic so that requests do not repeat each other. Every message received is appended to
  `<out stem>.raw.jsonl`, so a rerun (after a crash, or with a larger `--n`) keeps them and asks only
  for what is missing. Needs `ANTHROPIC_API_KEY`.

Both sources keep messages of `min_words`..`max_words` words with no personal data (emails, URLs,
handles, phone numbers, street addresses) and no profanity (`text_filters`), then drop exact and
MiniLM near-duplicates (`dedup`).

Output `data/prompts.jsonl`, one JSON object per line:
    {"id": "corpus-5d41402abc4b", "text": "I just got back from the beach", "category": "statement",
     "source": "corpus"}
- `id`: `<source>-<first 12 hex digits of sha1(normalized text)>`: the same message gets the same id in
  every run. Ids are 1-56 letters, digits, `-` or `_` (they become Message Batches custom ids).
- `category`: for `claude` a name in `CATEGORIES`; for `corpus` the sentence type read from the final
  punctuation (`question`, `exclamation`, `statement`).
- `source`: `corpus` or `claude`.
Beside it, `<out stem>.summary.json`: counts per category and source, messages filtered out by
reason, and duplicates removed.

    cpu: emoji-rl prompts --source corpus --n 300
    gpu: emoji-rl prompts --source claude --n 30000 --concurrency 16
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from emoji_rl.data import claude, dedup, prompt_sources
from emoji_rl.data.prompt_sources import Config
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import Record, read_jsonl, write_json, write_jsonl
from emoji_rl.lm import models

log = logging.getLogger(__name__)

_ID = re.compile(r"^[A-Za-z0-9_-]{1,56}$")


@dataclass(frozen=True)
class Prompt:
    """One line of `prompts.jsonl` (schema in the module docstring)."""

    id: str
    text: str
    category: str
    source: str

    @classmethod
    def from_record(cls, record: Record) -> Prompt:
        values = {f.name: record[f.name] for f in dataclasses.fields(cls)}
        for name, value in values.items():
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"field {name!r} must be a non-empty string, got {value!r}")
        if not _ID.match(values["id"]):
            raise ValueError(f"id {values['id']!r} must be 1-56 letters, digits, '-' or '_'")
        return cls(**values)

    def to_record(self) -> Record:
        return dataclasses.asdict(self)


def prompt_id(source: str, text: str) -> str:
    return f"{source}-{hashlib.sha1(dedup.normalize(text).encode()).hexdigest()[:12]}"


def held_out(ids: list[str], fraction: float, seed: int) -> set[str]:
    """A seeded `fraction` of `ids` (at least one), the same for the same set of ids in any order."""
    order = sorted(ids)
    random.Random(seed).shuffle(order)
    return set(order[: max(1, round(len(order) * fraction))])


def read_prompts(path: str | Path) -> list[Prompt]:
    """The prompts of a `prompts.jsonl` file; a malformed line or a repeated id is an error."""
    prompts = read_jsonl(path, Prompt.from_record, hint="make it with `emoji-rl prompts`")
    repeated = [i for i, count in Counter(p.id for p in prompts).items() if count > 1]
    if repeated:
        raise UserError(f"{path}: ids must be unique; repeated: {', '.join(repeated[:5])}")
    return prompts


def summary_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.stem + ".summary.json")


def make_prompts(source: str, sample: prompt_sources.Sample) -> list[Prompt]:
    return [Prompt(prompt_id(source, text), text, category, source) for text, category in sample.messages]


def summarize(cfg: Config, prompts: list[Prompt], sample: prompt_sources.Sample) -> Record:
    return {
        "source": cfg.source,
        "requested": cfg.n,
        "prompts": len(prompts),
        "by_category": dict(Counter(p.category for p in prompts).most_common()),
        "by_source": dict(Counter(p.source for p in prompts).most_common()),
        "examined": sample.examined,
        "filtered": dict(sample.filtered.most_common()),
        "duplicates_removed": {"exact": sample.duplicates["exact"], "near": sample.duplicates["near"]},
    }


def main(cfg: Config) -> None:
    if cfg.source == "claude":
        claude.require_key("--source claude", f"emoji-rl prompts --source corpus --n {cfg.n}")
    deduper = dedup.Deduper(models.load_embedder(cfg.embedder), cfg.dedup_threshold)
    if cfg.source == "corpus":
        sample = prompt_sources.corpus_sample(cfg, deduper, prompt_sources.corpus_texts())
    else:
        sample = prompt_sources.claude_sample(cfg, claude.make_client(cfg.max_retries), deduper)
    prompts = make_prompts(cfg.source, sample)
    write_jsonl(cfg.path, (p.to_record() for p in prompts))
    report = summarize(cfg, prompts, sample)
    write_json(summary_path(cfg.path), report)
    for key in ("by_category", "filtered", "duplicates_removed"):
        log.info(
            "%s: %s", key.replace("_", " "), ", ".join(f"{k} {v}" for k, v in report[key].items()) or "none"
        )
    print(
        f"wrote {len(prompts)} prompts to {cfg.path} ({sample.examined} examined; summary in {summary_path(cfg.path)})"
    )
