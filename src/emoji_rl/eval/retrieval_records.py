"""eval-retrieval's records: one per game (what each turn sent, what the judge guessed, whether the
final guess picked out its target among the K-1 distractors drawn for it), a system's row from them,
and the log they are appended to as they are played (`RECORDS_LOG`), headed by the fingerprint of the
config they depend on, so a rerun plays only the games it lacks and one of another config is refused.

Apart from the stage (`eval/retrieval.py`), which plays the games and writes the report: this is what
a game leaves on disk and when a rerun may trust it. The stage's `Config` imports this module, so it
is read here through `Settings`, the fields these read."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Protocol

from emoji_rl.emoji.stats import reply_stats
from emoji_rl.errors import DataError, UserError
from emoji_rl.eval.compare import LEVEL, sent_texts
from emoji_rl.eval.intervals import bootstrap_mean
from emoji_rl.games.retrieval.game import SUCCESS_THRESHOLDS
from emoji_rl.io.jsonl import AppendLog, Record
from emoji_rl.lm.adapters import adapter_hash, require_adapter

if TYPE_CHECKING:
    from emoji_rl.decode.senders import System
    from emoji_rl.game.similarity import Similarity
    from emoji_rl.game.types import Episode

RECORDS_LOG = "retrieval_records.jsonl"
# The config fields a game's record depends on, besides the data and the systems (`fingerprint`). Not
# batch_size: a rerun with a smaller batch after running out of memory may go on from the log (a
# greedy game's record is the same at any batch size, to float rounding).
RESULT_FIELDS = (
    "model",
    "protocol",
    "sender_temperature",
    "num_beams",
    "guidance_scale",
    "max_new_tokens",
    "min_emoji",
    "max_emoji",
    "max_turns",
    "tau",
    "distractors",
    "similarity_model",
    "seed",
    "judge",
    "judge_view",
    "judge_model",
    "judge_temperature",
)


class Settings(Protocol):
    """What these read of eval-retrieval's `Config`, besides `RESULT_FIELDS` (read by name)."""

    resamples: int
    seed: int
    min_emoji: int
    max_emoji: int
    distractors: int


def distractor_sets(targets: Sequence[str], k: int, seed: int) -> list[list[str]]:
    """Per target, the K candidates retrieval@1 ranks: the target first, then K-1 other targets (a
    seeded draw, so every system is ranked among the same ones)."""
    pool = list(dict.fromkeys(targets))
    if len(pool) < k:
        raise UserError(
            f"retrieval@1 among {k} needs at least {k} distinct targets, the data has {len(pool)}"
        )
    rng = random.Random(seed)
    return [[target, *rng.sample([t for t in pool if t != target], k - 1)] for target in targets]


def retrieved(
    similarity: Similarity, candidates: Sequence[Sequence[str]], guesses: Sequence[str]
) -> list[bool]:
    """Per guess, whether its own target (candidates[i][0]) is nearer to it than every distractor;
    a tie is a miss, as in `reward.retrieval_at_1`. One embedding call for all."""
    pairs = [(c, g) for cands, g in zip(candidates, guesses, strict=True) for c in cands]
    scores = similarity.similarity([c for c, _ in pairs], [g for _, g in pairs])
    hits, start = [], 0
    for cands in candidates:
        row, start = scores[start : start + len(cands)], start + len(cands)
        hits.append(all(row[0] > other for other in row[1:]))
    return hits


def episode_record(episode: Episode, system: str, mode: str, record: Record, index: int) -> Record:
    """One message's game: what each turn sent and what the judge guessed, the final similarity."""
    final = episode.turns[-1].result
    turns = [
        {k: v for k, v in turn.result.log.items() if k in ("emoji", "guess", "violation")}
        for turn in episode.turns
    ]
    return {
        "system": system,
        "mode": mode,
        "id": str(record.get("id", index)),
        "target": record["target"],
        "turns": turns,
        "similarity": final.metrics["similarity"],
        "violation": bool(final.metrics["format_violation"]),
    }


def summarize(records: Sequence[Record], cfg: Settings) -> dict[str, float | int | None]:
    """A system's row in one mode, from its per-message records (those with `retrieved` set)."""
    n = len(records)
    similarity = bootstrap_mean([r["similarity"] for r in records], cfg.resamples, cfg.seed, LEVEL)
    texts, stopped = sent_texts(records)
    stats = reply_stats(texts, cfg.min_emoji, cfg.max_emoji, stopped=stopped)
    return {
        "n": n,
        "similarity": similarity.mean,
        "similarity_lo": similarity.low,
        "similarity_hi": similarity.high,
        **{f"success@{t}": sum(r["similarity"] >= t for r in records) / n for t in SUCCESS_THRESHOLDS},
        "turns": sum(len(r["turns"]) for r in records) / n,
        "violations": sum(r["violation"] for r in records) / n,
        f"retrieval@1/{cfg.distractors}": sum(r["retrieved"] for r in records) / n,
        **{k: v for k, v in asdict(stats).items() if k not in ("replies", "compliance")},
    }


def not_applicable(system: System, mode: str) -> Record:
    return {"system": system.name, "mode": mode, "n": 0, "note": "n/a: one fixed message per target"}


def message_ids(records: Sequence[Record], path: str) -> list[str]:
    """Each message's id (its index where it has none): records, the log and comparisons are keyed by
    it, so two messages may not share one."""
    ids = [str(r.get("id", i)) for i, r in enumerate(records)]
    first: dict[str, int] = {}
    for number, message in enumerate(ids, 1):
        if first.setdefault(message, number) != number:
            raise DataError(path, number, f"id {message!r} again (first on line {first[message]})")
    return ids


def sha256(value: object) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()[:16]


def fingerprint(
    cfg: Settings,
    ids: Sequence[str],
    targets: Sequence[str],
    systems: dict[str, System],
    fixed: dict[str, list[str | None]],
) -> Record:
    """What a game's record depends on besides its system, mode and message: the messages (every
    target is another's distractor), what each system is (its adapter's files, not its path: a stage
    rerun retrains into the same directory; or its fixed answers, which the teacher's file, `seed` and
    `random_length` decide) and `RESULT_FIELDS`."""
    return {
        "data": sha256([ids, targets]),
        "systems": {s.name: system_fingerprint(s, fixed.get(s.name)) for s in systems.values()},
        **{key: getattr(cfg, key) for key in RESULT_FIELDS},
    }


def system_fingerprint(system: System, answers: Sequence[str | None] | None) -> str:
    if system.kind == "adapter":
        assert system.path is not None
        # Checked here, before the log keeps this hash, and not only when the adapters load.
        require_adapter(system.name, system.path)
        return f"adapter sha256:{str(adapter_hash(system.path))[:16]}"
    return "base" if answers is None else f"answers {sha256(answers)}"


def _flat(config: Record) -> Record:
    systems = {f"system {name}": spec for name, spec in config["systems"].items()}
    return {**{k: v for k, v in config.items() if k != "systems"}, **systems}


def logged_records(log: AppendLog, fingerprint: Record) -> dict[tuple[str, str, str], Record]:
    """The records in `log` by (system, mode, id), if the config lines that head its runs agree with
    `fingerprint`: each key equal, and each system in both the same (a system only one side has is
    fine). A run that brings a system of its own logs its config, so later runs check that one too."""
    config = json.loads(json.dumps(fingerprint))  # as the log holds it
    heads = [r["config"] for r in log.records if "config" in r]
    records = [r for r in log.records if "config" not in r]
    if records and not heads:
        raise UserError(
            f"{log.path} holds records but not the config that made them: delete it to start over, "
            "or choose another --output_dir"
        )
    stored = {k: v for head in heads for k, v in _flat(head).items()}
    current = _flat(config)
    for key in dict.fromkeys([*current, *stored]) if stored else ():
        one_sided = key.startswith("system ") and (key not in current or key not in stored)
        if current.get(key) != stored.get(key) and not one_sided:
            raise UserError(
                f"{log.path} holds the records of another config: {key} is {stored.get(key)!r} there and "
                f"{current.get(key)!r} here. Delete {log.path} to start over, or choose another --output_dir"
            )
    if current.keys() - stored.keys():
        log.append({"config": config})
    return {(r["system"], r["mode"], r["id"]): r for r in records}


def played_indices(system: System, answers: Sequence[str | None] | None, n: int, reference: int) -> list[int]:
    """The targets a system plays: all `n`, or the first `reference` for a system without an adapter
    of its own (base, teacher, random) when `reference` > 0, and of those only the ones a fixed
    system has an answer for."""
    limit = min(n, reference) if reference and system.kind != "adapter" else n
    return [i for i in range(limit) if answers is None or answers[i] is not None]


def unplayed_batches(indices: Sequence[int], batch_size: int, done: set[int]) -> list[list[int]]:
    """The sender batches of `indices` with a game not logged yet, cut as a whole run cuts them: a
    batch's draws follow from its first message (`batch_seed`), so one that a crash cut short is
    replayed whole and draws as it did."""
    batches = [list(indices[k : k + batch_size]) for k in range(0, len(indices), batch_size)]
    return [batch for batch in batches if not done.issuperset(batch)]


def batch_seed(seed: int, first: int) -> int:
    """Torch's seed for the sender batch that starts at message `first`. The same for every system and
    mode, so a sampled judge or sender differs by its inputs only; and not carried over from the batch
    before, so a rerun that plays only the missing batches draws as a whole run does."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{first}".encode()).digest()[:8], "little")
