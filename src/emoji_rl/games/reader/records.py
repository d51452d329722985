"""The records the reader plays: an SFT split of the teacher's answers (`emoji-rl teacher` writes
data/sft_{train,test}.jsonl), each read as {"id", "target", "emoji"}; for training (grpo.py) and for
the held-out evaluation (evaluation.py) alike."""

from __future__ import annotations

from emoji_rl.emoji.alphabet import SEPARATOR, parse_message
from emoji_rl.io.jsonl import read_jsonl
from emoji_rl.play.types import Record

DATA_HINT = "an SFT split of the teacher's answers: make it with `emoji-rl teacher` (data/sft_train.jsonl)"


def reader_record(record: dict, min_emoji: int, max_emoji: int) -> Record:
    """One SFT record as the reader plays it, {"id", "target", "emoji"} with the teacher's emoji
    canonical; a ValueError says what the record lacks (`read_jsonl` names its file and line)."""
    target = record.get("target")
    if not isinstance(target, str) or not target.strip():
        raise ValueError("the record has no non-empty string `target`")
    messages = record.get("messages")
    said = [
        m.get("content")
        for m in (messages if isinstance(messages, list) else [])
        if isinstance(m, dict) and m.get("role") == "assistant"
    ]
    if not said or not isinstance(said[-1], str):
        raise ValueError("the record has no assistant turn in `messages` (the teacher's emoji)")
    parsed = parse_message(said[-1].strip(), min_emoji, max_emoji)
    if not parsed.ok:
        raise ValueError(f"the teacher's answer {said[-1]!r} is not an emoji message: {parsed.reason}")
    ids = {"id": str(record["id"])} if "id" in record else {}
    return {**ids, "target": target, "emoji": SEPARATOR.join(parsed.emoji)}


def read_reader_records(path: str, min_emoji: int, max_emoji: int) -> list[Record]:
    """Every record of an SFT split as the reader plays it, checked before any model loads."""
    return read_jsonl(path, lambda record: reader_record(record, min_emoji, max_emoji), hint=DATA_HINT)
