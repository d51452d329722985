"""SFT records: read and validate the chat JSONL, and turn each record into the exact token ids the
chat template gives, with a mask over the answer.

A record is `{"messages": [system, user, assistant], ...}` (optional `id` and `target` keys), as the
data stage writes it from `prompts.sender_messages(target)`. The prompt is rendered by
`template.chat_ids(..., add_generation_prompt=True)`, the ids every later stage feeds the model, and the
completion is what the template adds for the answer (content, end of turn and anything the template
writes after it). `encode_record` checks that prompt + completion is token for token the rendering of
the whole chat, so the SFT model learns on exactly the context RL samples from.

A record with a `turn` key is one turn of a multi-turn game (`emoji-rl wordle-data` writes them):
`[system, user, assistant, user, …, assistant]`, the last reply the one to learn. It is encoded as
the game grows its episode in RL (`template.continuation_ids`), never by rendering the whole chat:
Qwen3.5's template drops the `<think>…</think>` of every assistant turn before the last user turn
and rewrites the last one's (tests/fixtures/qwen3_5_chat_template.jinja), while the policy in RL sees
its earlier replies token for token.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.sender_prompts import SENDER_FIRST_TURN
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import read_jsonl
from emoji_rl.lm.template import chat_ids, continuation_ids, stop_token_id
from emoji_rl.play.guessing import JudgeInput, JudgeView, judge_messages

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

ROLES = frozenset({"system", "user", "assistant"})
Overlong = Literal["drop", "truncate"]


@dataclass(frozen=True)
class ChatRecord:
    """One conversation whose last turn is the assistant answer to learn."""

    messages: tuple[dict[str, str], ...]
    target: str | None
    """The message the emoji encode: the `target` key, else read back from the sender prompt; None if neither."""
    episode: bool = False
    """One turn of a multi-turn game (the record has a `turn` key): encoded as the game grows its ids."""

    @property
    def prompt(self) -> list[dict[str, str]]:
        return list(self.messages[:-1])

    @property
    def answer(self) -> str:
        return self.messages[-1]["content"]

    @classmethod
    def from_record(cls, record: dict) -> ChatRecord:
        """Validate one JSONL object; a ValueError here becomes a DataError naming the file and line."""
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError("`messages` must be a non-empty list of {role, content} objects")
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
                raise ValueError(f"messages[{i}] must be {{role: system|user|assistant, content: str}}")
        if messages[-1]["role"] != "assistant":
            raise ValueError(
                f"the last turn is {messages[-1]['role']!r}, not 'assistant': "
                "an SFT record ends with the answer to learn"
            )
        if len(messages) < 2:
            raise ValueError("the record is only an assistant turn: it needs a prompt before the answer")
        target = record.get("target")
        if target is not None and not isinstance(target, str):
            raise ValueError(f"`target` must be a string, got {type(target).__name__}")
        episode = "turn" in record
        if episode:
            first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
            roles = [m["role"] for m in messages[first:]]
            if roles[0::2] != ["assistant"] * len(roles[0::2]) or set(roles[1::2]) - {"user"}:
                raise ValueError(
                    "a game turn (a record with `turn`) alternates assistant and user turns after the first reply"
                )
        return cls(tuple(messages), target if target is not None else _target_from_prompt(messages), episode)


def _target_from_prompt(messages: list[dict[str, str]]) -> str | None:
    head, _, tail = SENDER_FIRST_TURN.partition("{target}")
    user = next((m["content"] for m in messages if m["role"] == "user"), "")
    if user.startswith(head) and user.endswith(tail):
        return user[len(head) : len(user) - len(tail)]
    return None


def load_chat_records(path: str | Path) -> list[ChatRecord]:
    """Every record of an SFT JSONL file, validated up front; a bad line is a DataError naming it."""
    return read_jsonl(path, ChatRecord.from_record, hint="the data stage writes it")


def reader_chats(records: Sequence[ChatRecord], share: float, view: JudgeView, seed: int) -> list[ChatRecord]:
    """The reader's seat taught from the sender's data: for a `share` of the records (a draw of each
    record's own, by seed and target), the pair reversed, the guessing chat a reader is shown
    (`judge_messages` of the record's emoji, in `view`) answered by the message.

    An adapter trained on the sender's chats alone answers every chat in emoji, the reader's too, and
    a guess stripped of its emoji is `[unknown]` (docs/DESIGN.md §15): a policy that plays both seats
    must start able to read. Records without a target, game turns and answers that are no emoji
    message under the grammar give none."""
    chats = []
    for record in records:
        if record.target is None or record.episode:
            continue
        parsed = parse_message(record.answer.strip())
        if parsed.ok and random.Random(f"{seed}:reader:{record.target}").random() < share:
            chat = judge_messages(JudgeInput((parsed.emoji,)), view)
            chats.append(ChatRecord((*chat, {"role": "assistant", "content": record.target}), record.target))
    return chats


@dataclass(frozen=True)
class Encoded:
    """Token ids of a whole chat; the loss covers `input_ids[completion_start:]`."""

    input_ids: tuple[int, ...]
    completion_start: int


def encode_record(tokenizer: PreTrainedTokenizerBase, record: ChatRecord) -> Encoded:
    """Prompt ids as every stage renders them, then the answer as the template continues them."""
    if record.episode:
        return encode_episode(tokenizer, record)
    prompt_ids = chat_ids(tokenizer, record.prompt, add_generation_prompt=True)
    full_ids = chat_ids(tokenizer, list(record.messages), add_generation_prompt=False)
    if full_ids[: len(prompt_ids)] != prompt_ids:
        raise UserError(
            f"{tokenizer.name_or_path}: the chat template renders the prompt differently on its own "
            f"(…{tokenizer.decode(prompt_ids[-8:])!r}) than inside the full chat "
            f"(…{tokenizer.decode(full_ids[len(prompt_ids) - 8 : len(prompt_ids)])!r}): training on it would "
            "not match the context RL samples from; fix the model's chat template"
        )
    # The end-of-turn token must be in the loss, or the model never learns to stop.
    if stop_token_id(tokenizer) not in full_ids[len(prompt_ids) :]:
        raise UserError(
            f"{tokenizer.name_or_path}: the chat template does not end the assistant turn with the stop token "
            f"{tokenizer.convert_ids_to_tokens(stop_token_id(tokenizer))!r}; the model would not learn to stop"
        )
    return Encoded(tuple(full_ids), len(prompt_ids))


def encode_episode(tokenizer: PreTrainedTokenizerBase, record: ChatRecord) -> Encoded:
    """A game turn's ids as the game builds them in RL: the first prompt rendered with the generation
    prompt, then every reply as its tokens and the stop token, each followed by `continuation_ids`
    (the next user turn and the opening of the next reply); the loss covers the last reply and its stop."""
    messages = list(record.messages)
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = chat_ids(tokenizer, messages[:first], add_generation_prompt=True)
    stop = stop_token_id(tokenizer)
    for k in range(first, len(messages) - 1, 2):
        action = [*tokenizer(messages[k]["content"], add_special_tokens=False)["input_ids"], stop]
        ids += action + continuation_ids(tokenizer, messages[:k], messages[k + 1], action)
    answer = tokenizer(record.answer, add_special_tokens=False)["input_ids"]
    return Encoded((*ids, *answer, stop), len(ids))


@dataclass(frozen=True)
class LengthReport:
    total: int
    overlong: int
    truncated: int
    dropped: int
    longest: int


def fit_to_length(
    examples: Sequence[Encoded], max_length: int, overlong: Overlong
) -> tuple[list[Encoded], LengthReport]:
    """Drop or truncate examples longer than `max_length` tokens. A truncated example keeps its prompt
    and the start of its answer; one left with no answer tokens is dropped either way."""
    kept: list[Encoded] = []
    truncated = dropped = 0
    for ex in examples:
        if len(ex.input_ids) <= max_length:
            kept.append(ex)
        elif overlong == "truncate" and ex.completion_start < max_length:
            kept.append(Encoded(ex.input_ids[:max_length], ex.completion_start))
            truncated += 1
        else:
            dropped += 1
    longest = max((len(ex.input_ids) for ex in examples), default=0)
    return kept, LengthReport(len(examples), truncated + dropped, truncated, dropped, longest)


def encode_file(
    tokenizer: PreTrainedTokenizerBase, path: str | Path, max_length: int, overlong: Overlong
) -> list[Encoded]:
    """Load, validate, encode and fit one file; over-long examples are counted in a warning."""
    return encode_records(tokenizer, load_chat_records(path), max_length, overlong, str(path))


def encode_records(
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[ChatRecord],
    max_length: int,
    overlong: Overlong,
    source: str,
) -> list[Encoded]:
    """Encode and fit `records` (from `source`, as messages name it); over-long examples are counted in
    a warning, and none left is an error."""
    encoded = [encode_record(tokenizer, r) for r in records]
    kept, report = fit_to_length(encoded, max_length, overlong)
    if report.overlong:
        logger.warning(
            "%s: %d of %d examples are longer than max_length=%d tokens (longest %d): %d truncated, %d dropped "
            "(overlong=%s; raise max_length to keep them whole)",
            source,
            report.overlong,
            report.total,
            max_length,
            report.longest,
            report.truncated,
            report.dropped,
            overlong,
        )
    if not kept:
        raise UserError(
            f"{source}: every example is longer than max_length={max_length} tokens "
            f"(the shortest {min(len(ex.input_ids) for ex in encoded)}); raise max_length"
        )
    return kept


def to_dataset(examples: Sequence[Encoded]) -> Dataset:
    """Pre-tokenized rows for TRL: it builds labels from `completion_mask` when completion_only_loss is on."""
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "input_ids": [list(ex.input_ids) for ex in examples],
            "completion_mask": [
                [0] * ex.completion_start + [1] * (len(ex.input_ids) - ex.completion_start) for ex in examples
            ],
        }
    )
