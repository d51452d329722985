"""The game protocol every environment implements, the records a rollout produces, and what a game's
setup builds for the stages that play it (`GameSetup`).

A game is played once: `start()` gives the first observation, each `step(action_ids)` takes the
policy's sampled token ids and returns the next observation. Observations are token ids that extend
the previous prompt + action, so a whole episode is one token sequence, trained as one example with a
loss mask over the policy's tokens. Anything shared (a partner model, an embedder, the tokenizer) is
built once by the game's setup and passed into each game's constructor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from emoji_rl.decode.generate import Constraint
    from emoji_rl.io.endpoint import Endpoint


@dataclass(frozen=True)
class StepResult:
    """What a game answers to one action."""

    done: bool
    """True when the episode is over; `next_observation_ids` is then empty."""
    reward: float
    """Terminal reward when `done`, else 0.0 (rewards are terminal only: docs/DESIGN.md §3)."""
    next_observation_ids: tuple[int, ...] = ()
    """Tokens to append after the action before the sender's next turn (game feedback + generation prompt)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numbers for logging (similarity, turns, reward terms), keyed by stable names."""
    log: dict[str, str] = field(default_factory=dict)
    """Text for the rollout log (the judge's guess, the parsed emoji), never aggregated."""


class Env(ABC):
    """One episode of a game being played (tinker's `Env`): it gives the first prompt and scores each
    action against the game's fixed environment. A finished one is an `Episode`."""

    @abstractmethod
    async def start(self) -> tuple[int, ...]:
        """The first prompt, as token ids ending with the generation prompt."""

    @abstractmethod
    async def step(self, action_ids: tuple[int, ...]) -> StepResult:
        """Score one sampled action (its token ids, stop token included when sampled)."""


@dataclass(frozen=True)
class Turn:
    """One sender turn inside an episode's token sequence."""

    observation_ids: tuple[int, ...]
    action_ids: tuple[int, ...]
    action_logprobs: tuple[float, ...]
    """The sampler's log-probs of `action_ids`, under the constraint it sampled with."""
    result: StepResult
    sampler_version: int | None = None
    """The adapter version that sampled this turn (`Sample.version`): the trainer step that published
    it; None: the weights being trained."""


@dataclass(frozen=True)
class Episode:
    """A finished game: turns in order and the terminal reward."""

    turns: tuple[Turn, ...]

    @property
    def reward(self) -> float:
        return self.turns[-1].result.reward

    def token_ids(self) -> tuple[int, ...]:
        """The whole episode as one sequence: obs_1 act_1 obs_2 act_2 ... act_T."""
        return tuple(t for turn in self.turns for t in (*turn.observation_ids, *turn.action_ids))

    def loss_mask(self) -> tuple[int, ...]:
        """1 on the sender's tokens, 0 on everything the game wrote."""
        return tuple(
            m
            for turn in self.turns
            for m in (*(0,) * len(turn.observation_ids), *(1,) * len(turn.action_ids))
        )


@dataclass(frozen=True)
class EpisodeGroup:
    """The G episodes played from one prompt: the unit the advantage is computed over."""

    prompt_id: str
    episodes: tuple[Episode, ...]
    target: str = ""
    """What the record asks of the policy (`GameSetup.target`), for the rollout log: a rollout read
    without it cannot be judged."""
    advantages: tuple[float, ...] = ()
    """Each episode's advantage, as the update trains on it (`rl.grpo.step_advantages`, set by the
    trainer's `collect`); empty until then."""

    def __post_init__(self) -> None:
        if self.advantages and len(self.advantages) != len(self.episodes):
            raise ValueError(
                f"group {self.prompt_id!r}: {len(self.advantages)} advantages for {len(self.episodes)} episodes"
            )

    @property
    def rewards(self) -> tuple[float, ...]:
        return tuple(e.reward for e in self.episodes)


class Stateful(Protocol):
    """State of a run outside the model and the optimizer that a resume must restore, such as a
    curriculum's phase: without it a resumed run would start the curriculum over."""

    def state_dict(self) -> dict[str, object]: ...

    def load_state_dict(self, state: dict[str, object]) -> None: ...


Record = dict[str, str]
"""One training or held-out record of a game: a JSONL line's fields (its `id` names its group)."""

HeldOutMetrics = Callable[[Sequence[Record], Sequence[int], Sequence[Episode]], list[dict[str, float]]]
"""held_out_metrics(records, indices, episodes): per episode, records[indices[i]] played as
episodes[i], the figures of the game's eval stage that its final metrics lack."""


@dataclass
class GameSetup:
    """What a game's setup builds, once, for training and evaluation alike: a builder of games from
    records, the records (`GameContext.records`), how the policy samples (`grammar`: emoji messages
    under the grammar, of the run's min_emoji..max_emoji; `none`: free text), a one-line description, what a record is about (its
    target, shown beside its group in logs), its headline metric (label, key: the progress bar shows
    it beside the reward), the seconds spent in the game's services since the start, any state of the
    run beyond the model that a checkpoint must hold (a curriculum), what learns from each step's
    groups, every process's, in rank order (the curriculum again): fed the same groups on every
    process, the processes take the same decisions, and what the held-out evaluation inside GRPO
    (rl/held_out.py) reports beside the final metrics. `servers`: the servers its services play on,
    by role (`judge`), whose own metrics each step logs (`rl/rollout/servers.py`).

    `held_out_metrics` is given every held-out record, though a process plays only its share: a figure
    that reads other records (retrieval@1 ranks a guess among other targets) is then the same on every
    process. It answers per episode, not a mean, so the processes' shares gather record by record.
    `modes`: the variants of the game an evaluation reports side by side, by name, each a builder of
    games on the same services (the retrieval game's `single` turn beside its `multi`-turn game);
    none: the game itself, as `multi`."""

    make_env: Callable[[Record], Env]
    records: list[Record]
    constraint: Constraint
    description: str
    target: Callable[[Record], str] = lambda record: ""
    headline: tuple[str, str] | None = None
    seconds: Callable[[], dict[str, float]] = dict
    state: Stateful | None = None
    observe: Callable[[Sequence[EpisodeGroup]], None] = lambda groups: None
    held_out_metrics: HeldOutMetrics = lambda records, indices, episodes: [{} for _ in episodes]
    servers: dict[str, Endpoint] = field(default_factory=dict)
    modes: dict[str, Callable[[Record], Env]] = field(default_factory=dict)

    def games(self) -> dict[str, Callable[[Record], Env]]:
        """The game's modes by name, in the order a report shows them (`modes`, or the game itself)."""
        return self.modes or {"multi": self.make_env}
