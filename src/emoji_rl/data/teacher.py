"""`emoji-rl teacher`: an emoji answer for every prompt, validated, split into SFT train and test.

Teachers (`teachers.py`, `claude_batch.py`): `offline` (MiniLM retrieval over emoji names, no
network, the cpu default), `claude-batch` (the Message Batches API; needs `ANTHROPIC_API_KEY`) and
`openai` (any OpenAI-compatible server, e.g. a local vLLM, constrained by the emoji grammar).
Every answer must pass `alphabet.parse_message` after its surrounding whitespace is stripped; a
rejected or errored answer is asked for again, up to `max_attempts` per prompt.

Files in `--output_dir` (default `data/`):
- `sft_train.jsonl`, `sft_test.jsonl`: a seeded 90/10 split; one chat record per line,
      {"id": "corpus-…", "target": "…", "messages": [<system>, <user>, {"role": "assistant",
       "content": "🍕 🎬 🌃"}]}
  where system and user are `prompts.sender_messages(target)`, the chat every stage uses. The
  answer is canonical: its emoji joined by single spaces. TRL's SFTTrainer reads `messages`, and its
  default `remove_unused_columns=True` drops `id` and `target`.
- `sft_stats.json`: counts, rejects by reason, the emoji-per-message histogram, distinct emoji,
  entropy, the share of the 10 most used and the 20 most used with their counts.
- `sft_rejects.jsonl`: every rejected attempt, {"id", "attempt", "target", "answer", "reason", "kind"}.
- `teacher_answers.jsonl`: every attempt, appended as it arrives, {"id", "attempt", "target",
  "answer", "error", "teacher"}: a rerun resumes from it (delete it to start over).
- `teacher_batches.json` (claude-batch): the batches made so far (`claude_batch.py`).

    cpu: emoji-rl teacher --teacher offline
    gpu: emoji-rl teacher --teacher claude-batch
         emoji-rl teacher --teacher openai --base_url http://localhost:8000/v1 --model Qwen/Qwen3-30B-A3B-Instruct-2507
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from emoji_rl.data import claude
from emoji_rl.data.prompts import Prompt, held_out, read_prompts
from emoji_rl.data.teachers import Answer, Request, Teacher
from emoji_rl.emoji.alphabet import MAX_EMOJI, MIN_EMOJI, SEPARATOR, parse_message
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.emoji.stats import emoji_counts, entropy_bits, top_k_share
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import AppendLog, Record, write_json, write_jsonl
from emoji_rl.lm import models

log = logging.getLogger(__name__)

TRAIN_FILE = "sft_train.jsonl"
TEST_FILE = "sft_test.jsonl"
STATS_FILE = "sft_stats.json"
REJECTS_FILE = "sft_rejects.jsonl"
ANSWERS_LOG = "teacher_answers.jsonl"
BATCH_STATE = "teacher_batches.json"


@dataclass
class Config:
    """Answer every prompt in emoji with a teacher; write the SFT train/test split and its stats."""

    # --- core
    teacher: Literal["offline", "claude-batch", "openai"] = field(
        default="offline",
        metadata={"help": "offline: MiniLM retrieval over emoji names; claude-batch: Message Batches API "
                  "(needs ANTHROPIC_API_KEY); openai: an OpenAI-compatible server such as vLLM"},
    )  # fmt: skip
    prompts: str = field(
        default="data/prompts.jsonl", metadata={"help": "input, from `emoji-rl prompts`", "input": True}
    )
    output_dir: str = field(
        default="data",
        metadata={"help": "directory of the outputs and the resume files", "aliases": ("out_dir",)},
    )
    test_fraction: float = field(
        default=0.1, metadata={"help": "share of answered prompts in sft_test, in (0, 1)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the train/test split"})
    min_emoji: int = field(
        default=MIN_EMOJI, metadata={"help": "fewest emoji in a valid answer (docs/DESIGN.md §2)"}
    )
    max_emoji: int = field(
        default=MAX_EMOJI, metadata={"help": "most emoji in a valid answer (docs/DESIGN.md §2)"}
    )
    max_attempts: int = field(
        default=3, metadata={"help": "requests per prompt, counting retries of rejected or errored answers"}
    )
    # --- offline teacher
    embedder: str = field(
        default=models.MINILM, metadata={"help": "sentence embedder spec (offline teacher)"}
    )
    vocabulary_min_count: int = field(
        default=0,
        metadata={"help": "offline teacher: answer only with emoji its own answers to all the prompts use at "
                  "least this often, the ones a small sender can learn (0: any emoji; docs/DESIGN.md §5)"},
    )  # fmt: skip
    # --- LLM teachers
    model: str | None = field(
        default=None,
        metadata={"help": f"model id; None: {claude.DEFAULT_MODEL} for claude-batch, required for openai"},
    )
    max_tokens: int = field(
        default=256,
        metadata={"help": "output token cap per answer; generation ends at the last emoji anyway"},
    )
    max_retries: int = field(
        default=8,
        metadata={
            "help": "SDK retries per API call on 429/529/5xx and (openai) refused connections, with backoff"
        },
    )
    poll_interval: float = field(
        default=60.0, metadata={"help": "seconds between batch status polls (claude-batch)"}
    )
    base_url: str = field(default="http://localhost:8000/v1", metadata={"help": "server URL (openai)"})
    api_key_env: str = field(
        default="OPENAI_API_KEY",
        metadata={
            "help": "environment variable holding the server's key (openai); unset: 'EMPTY', as vLLM accepts"
        },
    )
    concurrency: int = field(default=16, metadata={"help": "requests in flight at once (openai)"})
    temperature: float = field(default=0.7, metadata={"help": "sampling temperature (openai)"})

    def __post_init__(self) -> None:
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction={self.test_fraction} must be in (0, 1)")
        if not 1 <= self.min_emoji <= self.max_emoji:
            raise ValueError(f"min_emoji={self.min_emoji}, max_emoji={self.max_emoji}: need 1 <= min <= max")
        if self.max_attempts < 1 or self.concurrency < 1:
            raise ValueError(
                f"max_attempts={self.max_attempts} and concurrency={self.concurrency} must be >= 1"
            )
        if self.vocabulary_min_count < 0 or (self.vocabulary_min_count and self.teacher != "offline"):
            raise ValueError(
                f"vocabulary_min_count={self.vocabulary_min_count}: a count >= 0, and only with --teacher offline"
            )
        if self.teacher == "openai" and not self.model:
            raise ValueError("--teacher openai needs --model: the model name the server serves")


def check_answer(answer: str | None, min_emoji: int, max_emoji: int) -> tuple[str | None, str | None]:
    """(canonical answer, None) for a valid answer, else (None, why not)."""
    if answer is None:
        return None, "no answer"
    parsed = parse_message(answer.strip(), min_emoji, max_emoji)
    return (SEPARATOR.join(parsed.emoji), None) if parsed.ok else (None, parsed.reason)


def reason_kind(reason: str) -> str:
    """A reject reason without its particulars, for counting: `too few emoji: 1 < 2` -> `too few emoji`,
    `non-emoji character 'a' (U+0061) at position 0` -> `non-emoji character`."""
    return re.split(r":| at position| '| \(", reason, maxsplit=1)[0]


def _answer_record(answer: Answer, target: str, teacher: str) -> Record:
    return {
        "id": answer.id,
        "attempt": answer.attempt,
        "target": target,
        "answer": answer.text,
        "error": answer.error,
        "teacher": teacher,
    }


def _check_log(records: list[Record], targets: dict[str, str], path: Path) -> None:
    for r in records:
        if r["id"] in targets and r["target"] != targets[r["id"]]:
            raise UserError(
                f"{path} answers prompt {r['id']} for another text ({r['target']!r}): the prompts changed "
                f"since; delete {path} (and {BATCH_STATE} beside it) or choose another --output_dir"
            )


# Kept by earlier versions for a server that could not be reached: no answer, so no attempt spent.
UNREACHABLE = "api error: APIConnectionError"


def _todo(records: list[Record], prompts: list[Prompt], cfg: Config) -> list[Request]:
    """A request for every prompt with no valid answer yet and attempts left."""
    last: Counter[str] = Counter()
    spent: Counter[str] = Counter()
    done: set[str] = set()
    for r in records:
        last[r["id"]] = max(last[r["id"]], r["attempt"])
        spent[r["id"]] += r["error"] != UNREACHABLE
        if check_answer(r["answer"], cfg.min_emoji, cfg.max_emoji)[0] is not None:
            done.add(r["id"])
    return [
        Request(p.id, last[p.id] + 1, p.text)
        for p in prompts
        if p.id not in done and spent[p.id] < cfg.max_attempts
    ]


def collect_answers(cfg: Config, teacher: Teacher, prompts: list[Prompt]) -> list[Record]:
    """Ask the teacher until every prompt has a valid answer or no attempts left; return every attempt."""
    targets = {p.id: p.text for p in prompts}
    with AppendLog(Path(cfg.output_dir) / ANSWERS_LOG) as answers:
        _check_log(answers.records, targets, answers.path)
        if answers.records:
            log.info("resuming: %s already holds %d answers", answers.path, len(answers.records))
        while todo := _todo(answers.records, prompts, cfg):
            seen = {(r["id"], r["attempt"]) for r in answers.records}
            added = 0
            bar = tqdm(teacher.run(todo), total=len(todo), desc=f"{teacher.name} answers", unit="msg")
            for answer in bar:
                # A resumed batch may repeat what the log has; the first answer to an attempt wins.
                if (answer.id, answer.attempt) in seen or answer.id not in targets:
                    continue
                seen.add((answer.id, answer.attempt))
                answers.append(_answer_record(answer, targets[answer.id], teacher.name))
                added += 1
            assert added, f"teacher {teacher.name} answered none of {len(todo)} requests"
        return list(answers.records)


def sft_record(prompt: Prompt, answer: str) -> Record:
    messages = [*sender_messages(prompt.text), {"role": "assistant", "content": answer}]
    return {"id": prompt.id, "target": prompt.text, "messages": messages}


def emoji_stats(answers: list[str]) -> Record:
    emoji = [a.split(SEPARATOR) for a in answers]
    return {
        "emoji_per_message": {str(k): v for k, v in sorted(Counter(map(len, emoji)).items())},
        "distinct_emoji": len(emoji_counts(emoji)),
        "entropy_bits": round(entropy_bits(emoji), 3),
        "top10_share": round(top_k_share(emoji, 10), 3),
        "top20": dict(emoji_counts(emoji).most_common(20)),
    }


def write_outputs(cfg: Config, prompts: list[Prompt], records: list[Record], teacher: str) -> Record:
    """Split the valid answers into train and test, write them with the rejects; return the stats."""
    accepted: dict[str, str] = {}
    rejects = []
    for r in records:
        answer, reason = check_answer(r["answer"], cfg.min_emoji, cfg.max_emoji)
        if answer is not None:
            accepted.setdefault(r["id"], answer)
            continue
        # A teacher's error ("api error: overloaded_error") is already a kind; a parse reason has details.
        kind = r["error"] or reason_kind(reason or "")
        reject = {k: r[k] for k in ("id", "attempt", "target", "answer")}
        rejects.append({**reject, "reason": r["error"] or reason, "kind": kind})
    out = Path(cfg.output_dir)
    write_jsonl(out / REJECTS_FILE, rejects)
    answered = [p for p in prompts if p.id in accepted]
    if not answered:
        raise UserError(
            f"the {teacher} teacher gave no valid answer for any of {len(prompts)} prompts; see "
            f"{out / REJECTS_FILE}"
        )
    test_ids = held_out([p.id for p in answered], cfg.test_fraction, cfg.seed)
    n_train = write_jsonl(
        out / TRAIN_FILE, (sft_record(p, accepted[p.id]) for p in answered if p.id not in test_ids)
    )
    n_test = write_jsonl(
        out / TEST_FILE, (sft_record(p, accepted[p.id]) for p in answered if p.id in test_ids)
    )
    stats = {
        "teacher": teacher,
        "prompts": len(prompts),
        "answered": len(answered),
        "unanswered": len(prompts) - len(answered),
        "train": n_train,
        "test": n_test,
        "attempts": len(records),
        "rejected": len(rejects),
        "rejects_by_reason": dict(Counter(r["kind"] for r in rejects).most_common()),
        **emoji_stats([accepted[p.id] for p in answered]),
    }
    write_json(out / STATS_FILE, stats)
    return stats


def build_teacher(cfg: Config, prompts: list[Prompt]) -> Teacher:
    if cfg.teacher == "offline":
        from emoji_rl.data.teachers import OfflineTeacherAdapter

        return OfflineTeacherAdapter(
            models.load_embedder(cfg.embedder),
            cfg.min_emoji,
            cfg.max_emoji,
            cfg.vocabulary_min_count,
            [p.text for p in prompts],
        )
    if cfg.teacher == "openai":
        from emoji_rl.data.teachers import OpenAITeacher, watched_client

        api_key = os.environ.get(cfg.api_key_env) or "EMPTY"
        client, watch = watched_client(cfg.base_url, api_key, cfg.max_retries)
        assert cfg.model is not None  # __post_init__
        sampling = (cfg.max_tokens, cfg.temperature, cfg.concurrency)
        return OpenAITeacher(client, cfg.model, cfg.min_emoji, cfg.max_emoji, *sampling, watch=watch)
    from emoji_rl.data.claude_batch import ClaudeBatchTeacher

    return ClaudeBatchTeacher(
        claude.make_client(cfg.max_retries),
        cfg.model or claude.DEFAULT_MODEL,
        Path(cfg.output_dir) / BATCH_STATE,
        cfg.max_tokens,
        cfg.poll_interval,
        submit_retries=cfg.max_retries,
    )


def run(cfg: Config, teacher: Teacher, prompts: list[Prompt]) -> Record:
    """Everything `main` does once the teacher is built; tests pass a teacher with a mocked transport."""
    records = collect_answers(cfg, teacher, prompts)
    return write_outputs(cfg, prompts, records, teacher.name)


def main(cfg: Config) -> None:
    if cfg.teacher == "claude-batch":
        claude.require_key("--teacher claude-batch", "emoji-rl teacher --teacher offline")
    prompts = read_prompts(cfg.prompts)
    stats = run(cfg, build_teacher(cfg, prompts), prompts)
    log.info("rejects by reason: %s", stats["rejects_by_reason"] or "none")
    log.info("top emoji: %s", " ".join(f"{e}{c}" for e, c in list(stats["top20"].items())[:10]))
    print(
        f"{stats['answered']}/{stats['prompts']} prompts answered by {stats['teacher']}: "
        f"{stats['train']} train, {stats['test']} test, {stats['rejected']} rejected attempts, "
        f"{stats['distinct_emoji']} distinct emoji -> {Path(cfg.output_dir) / STATS_FILE}"
    )
