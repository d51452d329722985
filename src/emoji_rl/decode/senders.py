"""The senders' registry: what a system under evaluation is (`base`, NAME=ADAPTER_DIR, the teacher's
answers from a file, random emoji), the fixed answers the teacher and random systems give, and the
sampler a model plays as sender with.

It lives in decode/, beside the samplers it builds, so every stage that names its senders (the games'
evaluations, play-web) reads them from one place below them all; it takes its sampling settings as
arguments, not a stage's config. Loading the adapters a system names is `lm/adapters.py`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

from emoji_rl.decode.sampler import HFSampler, Sample
from emoji_rl.emoji.alphabet import parse_message, random_answers
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.emoji.stats import reply_stats
from emoji_rl.errors import DataError, UserError
from emoji_rl.io.jsonl import Record, read_jsonl
from emoji_rl.lm import template

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from emoji_rl.decode.generate import Decoding


@dataclass(frozen=True)
class System:
    """One sender under evaluation: the base model, a LoRA adapter on it, or fixed answers."""

    name: str
    kind: Literal["base", "adapter", "teacher", "random"]
    path: str | None = None

    @property
    def fixed(self) -> bool:
        """Answers given in advance, one message per target: single-turn only."""
        return self.kind in ("teacher", "random")


def parse_systems(specs: Sequence[str]) -> dict[str, str | None]:
    """Model senders (also read by the evaluations and play-web): `base` -> no adapter; `NAME=DIR` -> that
    adapter. Names must be unique."""
    systems: dict[str, str | None] = {}
    for spec in specs:
        name, _, adapter = spec.partition("=")
        if not name or (spec != "base" and not adapter):
            raise ValueError(f"system {spec!r}: use `base` or NAME=ADAPTER_DIR")
        if name in systems:
            raise ValueError(f"system name {name!r} appears twice in systems")
        systems[name] = adapter or None
    return systems


def eval_systems(specs: Sequence[str]) -> dict[str, System]:
    """`parse_systems`' senders, and the fixed answers `random` and `teacher=FILE`, in the given order."""
    fixed = {s.partition("=")[0] for s in specs if s == "random" or s.startswith("teacher=")}
    senders = parse_systems([s for s in specs if s.partition("=")[0] not in fixed])
    if len(fixed) + len(senders) < len(specs):
        raise ValueError(f"a system name appears twice in systems {list(specs)}")
    systems = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        if name in fixed:
            systems[name] = System(name, name, path or None)  # type: ignore[arg-type]
        else:
            systems[name] = System(name, "base" if senders[name] is None else "adapter", senders[name])
    return systems


def teacher_answers(path: str, targets: Sequence[str]) -> list[str | None]:
    """Per target, the teacher's answer from SFT split records (`target`, and `messages` whose last
    assistant turn holds the emoji), or None where the file has no record of that target."""
    answers = teacher_answer_map(path)
    return [answers.get(t) for t in targets]


def teacher_answer_map(path: str) -> dict[str, str]:
    """Every target's teacher answer in an SFT split (`teacher_answers`), by target."""
    answers: dict[str, str] = {}
    for number, record in enumerate(read_jsonl(path, hint="the teacher's SFT split (`emoji-rl teacher`)"), 1):
        said = [m.get("content") for m in record.get("messages") or [] if m.get("role") == "assistant"]
        if not isinstance(record.get("target"), str) or not said or not isinstance(said[-1], str):
            raise DataError(
                path, number, "record needs a string `target` and an assistant turn in `messages`"
            )
        answers[record["target"]] = said[-1]
    return answers


class FixedSender:
    """A sender whose one message per game is given in advance (teacher or random emoji), in the
    order of the games, which it is asked for in that order (a batch at a time): the judge reads them
    through the same game as a model's."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, answers: Sequence[str]) -> None:
        stop = template.stop_token_id(tokenizer)
        self.samples = [
            Sample((*tokenizer(a, add_special_tokens=False)["input_ids"], stop), ()) for a in answers
        ]
        self.given = 0

    async def sample(
        self, prompts: Sequence[tuple[int, ...]], previous: Sequence[Sample | None] | None = None
    ) -> list[Sample]:
        assert previous is None or not any(previous), "a fixed sender has no second turn"
        batch = self.samples[self.given : self.given + len(prompts)]
        assert len(batch) == len(prompts), f"{len(prompts)} games asked for, {len(batch)} answers left"
        self.given += len(batch)
        return batch


def teacher_system(systems: dict[str, System]) -> System | None:
    """The system that plays the teacher's own answers, if one was given."""
    return next((s for s in systems.values() if s.kind == "teacher"), None)


def fixed_answers(
    systems: dict[str, System],
    targets: Sequence[str],
    data: str,
    min_emoji: int,
    max_emoji: int,
    random_length: int,
    seed: int,
) -> dict[str, list[str | None]]:
    """The teacher's and the random system's answer per target (None: the teacher has none); random
    answers have the teacher's length for the message where there is one (else `random_length`).
    `data` is the targets' file, named when the teacher answers none of them."""
    answers: dict[str, list[str | None]] = {}
    teacher = teacher_system(systems)
    if teacher is not None:
        answers[teacher.name] = teacher_answers(str(teacher.path), targets)
        if not any(answers[teacher.name]):
            raise UserError(
                f"{teacher.path} answers none of the {len(targets)} targets of {data}: "
                "give the SFT split that holds them (sft_test.jsonl for the SFT test split; sft_train.jsonl "
                "for rl-prompts' rl_eval.jsonl, whose targets it takes from outside sft_test)"
            )
        for target, answer in zip(targets, answers[teacher.name], strict=True):
            if answer is not None and not parse_message(answer, min_emoji, max_emoji).ok:
                raise UserError(
                    f"{teacher.path}: the answer {answer!r} for {target!r} is not an emoji message"
                )
    if "random" in systems:
        matched = answers[teacher.name] if teacher is not None else [None] * len(targets)
        lengths = [random_length if a is None else len(parse_message(a).emoji) for a in matched]
        answers["random"] = list(random_answers(lengths, seed))
    return answers


def teacher_emoji(
    systems: dict[str, System], fixed: dict[str, list[str | None]], min_emoji: int, max_emoji: int
) -> Record | None:
    """Emoji statistics of the teacher's answers to every target it answered, played or not: the data a
    sender's distinct emoji and entropy on the whole split are measured against, when `reference_examples`
    lets the teacher play only the first few."""
    teacher = teacher_system(systems)
    if teacher is None:
        return None
    answers = [a for a in fixed[teacher.name] if a is not None]
    return {"system": teacher.name, **asdict(reply_stats(answers, min_emoji, max_emoji))}


def model_sender(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, decoding: Decoding) -> HFSampler:
    """A model as sender: emoji-constrained (`grammar`), or free text the parser filters (`none`);
    classifier-free guidance scores against the sender's prompt for an empty message."""
    return HFSampler(model, tokenizer, decoding, template.chat_ids(tokenizer, sender_messages("")))
