"""Talk to a model in emoji: type a message, get it back as 2–8 emoji.

Emoji-constrained by default (the xgrammar grammar). `--unconstrained` samples freely; `--static_mask`
uses the seed's bag of emoji token ids, which lets byte fragments combine into non-emoji characters.
`--compare` answers each message all three ways side by side and says which replies are valid.

    emoji-rl chat                                          # interactive, embedded SmolLM2
    emoji-rl chat --message "Let's get pizza tonight"      # answer once, for scripts
    emoji-rl chat --model Qwen/Qwen3.5-4B --adapter runs/sft/adapter --compare --message "..."
"""

from __future__ import annotations

from dataclasses import dataclass, field

from emoji_rl.decode.generate import Constraint, SamplingConfig, generate_replies
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import UserError
from emoji_rl.lm import models


@dataclass
class Config(SamplingConfig, models.ModelConfig):
    """Chat with a model in emoji."""

    adapter: str | None = field(default=None, metadata={"help": "PEFT adapter directory to load on top"})
    message: list[str] | None = field(
        default=None, metadata={"help": "answer these messages once and exit (else interactive)"}
    )
    unconstrained: bool = field(default=False, metadata={"help": "sample without the emoji grammar"})
    static_mask: bool = field(
        default=False,
        metadata={"help": "the seed's static emoji-token mask instead of the grammar (baseline)"},
    )
    compare: bool = field(
        default=False, metadata={"help": "answer with grammar, static mask and unconstrained side by side"}
    )
    seed: int = field(default=0, metadata={"help": "random seed for sampling"})

    def __post_init__(self) -> None:
        if self.unconstrained and self.static_mask:
            raise ValueError("--unconstrained and --static_mask exclude each other: pick one decoding mode")
        if not 1 <= self.min_emoji <= self.max_emoji:
            raise ValueError(f"need 1 <= min_emoji <= max_emoji, got {self.min_emoji} and {self.max_emoji}")
        if self.message is not None and not all(m.strip() for m in self.message):
            raise ValueError("--message: an empty message has nothing to say in emoji")

    @property
    def modes(self) -> list[Constraint]:
        if self.compare:
            return ["grammar", "static", "none"]
        return ["none" if self.unconstrained else "static" if self.static_mask else "grammar"]


def _answer(cfg: Config, model, tokenizer, messages: list[str]) -> dict[Constraint, list[str]]:
    conversations = [sender_messages(m) for m in messages]
    return {
        mode: [
            r.text
            for r in generate_replies(
                model, tokenizer, conversations, cfg.decoding(constraint=mode), seed=cfg.seed
            )
        ]
        for mode in cfg.modes
    }


_LABELS: dict[Constraint, str] = {"grammar": "grammar", "static": "static mask", "none": "unconstrained"}


def _print_answers(cfg: Config, messages: list[str], answers: dict[Constraint, list[str]]) -> None:
    for i, message in enumerate(messages):
        print(f"\n> {message}")
        for mode, texts in answers.items():
            verdict = parse_message(texts[i], cfg.min_emoji, cfg.max_emoji)
            status = "valid" if verdict.ok else f"INVALID: {verdict.reason}"
            label = f"{_LABELS[mode]:>13}: " if len(answers) > 1 else ""
            print(f"  {label}{texts[i]!r}  [{status}]")
    if len(messages) > 1 or len(answers) > 1:
        print()
        for mode, texts in answers.items():
            valid = sum(parse_message(t, cfg.min_emoji, cfg.max_emoji).ok for t in texts)
            print(f"{_LABELS[mode]:>13}: {valid}/{len(texts)} valid emoji messages")


def main(cfg: Config) -> None:
    runtime = models.pick_runtime()
    tokenizer = models.load_tokenizer(cfg.model)
    model = models.load_causal_lm(cfg.model, runtime, adapter=cfg.adapter)
    if cfg.message:
        _print_answers(cfg, cfg.message, _answer(cfg, model, tokenizer, cfg.message))
        return
    print(f"Chatting with {cfg.model} ({runtime.describe()}). Type a message; an empty line or Ctrl-D quits.")
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            print()
            return
        if not line:
            return
        try:
            _print_answers(cfg, [line], _answer(cfg, model, tokenizer, [line]))
        except UserError as err:
            print(f"error: {err}")
