"""The reader's partner: a frozen sender that sees the message and the reader's last guess and adds
emoji, under the grammar. It is shown exactly what the retrieval game's sender is shown after a wrong
guess (`emoji/sender_prompts.py`): the sender prompt, its earlier emoji as its own turns, and the
correction turn; so the SFT sender, or the base model, plays here the seat it plays there.

It answers through a `Completer` (`play/completer.py`): the base model or an adapter in this process
(`hf`), or a model an OpenAI-compatible server serves (`openai`), by default the policy server's base.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from emoji_rl.config import Checked
from emoji_rl.decode.generate import MAX_NEW_TOKENS
from emoji_rl.emoji.alphabet import SEPARATOR, parse_message
from emoji_rl.emoji.sender_prompts import correction_message, sender_messages
from emoji_rl.errors import UserError
from emoji_rl.play.completer import Completer, Completion

if TYPE_CHECKING:
    from emoji_rl.lm.models import Runtime

PartnerKind = Literal["hf", "openai"]
# Where a served name comes from, for the error a wrong partner_model gets from the server.
POLICY_SERVER_HINT = "POLICY_NAME in launch/serve_policy.sh, the trainer's --vllm_served_name"


@dataclass(frozen=True)
class PartnerInput:
    """What the sender sees of one episode: the message, the emoji sent so far (the teacher's first),
    and the reader's cleaned guess after each of those turns."""

    target: str
    turns: tuple[tuple[str, ...], ...]
    guesses: tuple[str, ...]

    def __post_init__(self) -> None:
        assert self.turns and len(self.guesses) == len(self.turns), (self.turns, self.guesses)


def partner_messages(episode: PartnerInput) -> list[dict[str, str]]:
    """The sender's chat: the first-turn prompt, then each emoji turn as its own answer followed by the
    correction turn that shows the reader's guess."""
    messages = sender_messages(episode.target)
    for turn, guess in zip(episode.turns, episode.guesses, strict=True):
        messages.append({"role": "assistant", "content": SEPARATOR.join(turn)})
        messages.append(correction_message(guess, episode.target))
    return messages


class Partner:
    """The frozen sender, built once and shared by every game of a run; one batched call per turn."""

    def __init__(self, completer: Completer) -> None:
        if not completer.settings.emoji:
            raise ValueError("the reader's partner answers in emoji: its Completion needs emoji=True")
        self.completer = completer

    async def add(self, episodes: Sequence[PartnerInput]) -> list[tuple[str, ...] | None]:
        """The emoji each episode's sender adds, or None where its answer is not an emoji message (cut
        off by the token budget, or a server that ignored the grammar)."""
        settings = self.completer.settings
        answers = await self.completer.complete([partner_messages(episode) for episode in episodes])
        parsed = [parse_message(answer.strip(), settings.min_emoji, settings.max_emoji) for answer in answers]
        return [p.emoji if p.ok else None for p in parsed]

    def describe(self) -> str:
        return self.completer.describe()


@dataclass
class PartnerConfig(Checked):
    """The `partner_*` fields: which frozen sender adds emoji from the reader's second turn on."""

    partner: PartnerKind = field(
        default="hf",
        metadata={
            "help": "where the frozen sender runs: hf (in this process) or openai (an OpenAI-compatible "
            "server; by default the policy server, whose base model answers under the grammar)"
        },
    )
    partner_model: str | None = field(
        default=None,
        metadata={
            "help": "hf: the sender's model spec (none: the policy's `model`); openai: the served model "
            "name (none: vllm_served_name, the policy server's base)"
        },
    )
    partner_adapter: str | None = field(
        default=None,
        metadata={"help": "hf: a LoRA adapter on partner_model, such as the SFT sender's; none: the base"},
    )
    partner_url: str | None = field(
        default=None, metadata={"help": "openai: the server's base URL (none: vllm_url, the policy server)"}
    )
    partner_api_key_env: str | None = field(
        default="POLICY_API_KEY",
        metadata={"help": "openai: env var holding the server's key; unset sends none"},
    )
    partner_temperature: float = field(
        default=0.0,
        metadata={
            "help": "the sender's sampling temperature; 0: greedy, the same emoji for the same guess, so "
            "a reward's spread inside a group is the reader's alone",
            "min": 0.0,
        },
    )
    partner_max_new_tokens: int = field(
        default=MAX_NEW_TOKENS, metadata={"help": "token budget of one sender turn", "min": 1}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.partner == "hf" and self.partner_model is not None:
            from emoji_rl.lm.models import ModelSpec

            try:
                ModelSpec.parse(self.partner_model)
            except UserError as err:
                raise UserError(f"partner_model: {err}") from None
        if self.partner == "openai" and self.partner_adapter is not None:
            raise UserError(
                f"partner_adapter={self.partner_adapter} applies to partner=hf: on a server an adapter is "
                "a served name, so set partner_model to the name it was loaded under"
            )

    def build_partner(
        self,
        runtime: Runtime,
        *,
        model: str,
        url: str,
        served_name: str,
        min_emoji: int,
        max_emoji: int,
        wait_s: float,
    ) -> Partner:
        """The sender these fields describe; `model`, `url` and `served_name` are the policy's, which an
        unset partner_model or partner_url falls back on; the grammar allows min..max emoji; a server
        is waited for up to `wait_s` seconds."""
        settings = Completion(
            self.partner_temperature, self.partner_max_new_tokens, True, min_emoji, max_emoji
        )
        if self.partner == "hf":
            from emoji_rl.lm import models
            from emoji_rl.lm.adapters import adapter_config
            from emoji_rl.play.completer import HFCompleter

            spec = self.partner_model or model
            if self.partner_adapter is not None:
                adapter_config(self.partner_adapter)  # a wrong directory is named before the model loads
            try:
                loaded = models.load_causal_lm(spec, runtime, self.partner_adapter)
                tokenizer = models.load_tokenizer(spec)
            except UserError as err:
                raise UserError(f"partner_model: {err}") from None
            name = spec if self.partner_adapter is None else f"{spec}+{self.partner_adapter}"
            return Partner(HFCompleter(loaded, tokenizer, name, settings))
        from emoji_rl.io.endpoint import Endpoint, wait_for_server
        from emoji_rl.play.completer import OpenAICompleter

        where = self.partner_url or url
        wait_for_server(
            where,
            "the partner server",
            wait_s,
            "start it with make serve-policy (launch/serve_policy.sh), or point --partner_url at the one "
            "serving the sender",
        )
        completer = OpenAICompleter(
            Endpoint(where, self.partner_api_key_env),
            self.partner_model or served_name,
            settings,
            model_hint=POLICY_SERVER_HINT,
        )
        return Partner(completer)
