"""The game protocol every environment implements, the records a rollout produces, and what a game's
setup builds for the stages that play it (`GameSetup`).

A game is played once: `start()` gives the first observation, each `step(action_ids)` takes the
policy's sampled token ids and returns the next observation. Observations are token ids that extend
the previous prompt + action, so a seat's turns are one token sequence, trained as one example with a
loss mask over the policy's tokens. Anything shared (a partner model, an embedder, the tokenizer) is
built once by the game's setup and passed into each game's constructor.

Seats (docs/DESIGN.md §14). The policy may play several seats of one game, each in a chat of its own
(the sender's, under the emoji grammar; the reader's, in free text): a game declares its `Seat`s, says
before each turn whose it is (`Env.seat`), and gives each seat its terminal reward
(`StepResult.seat_rewards`). Each turn records its seat, each seat's turns form that seat's own token
sequence (`Episode.of`), and the trainer takes advantages per (group, seat): one seat's reward scale
never moves the other's. A game that declares none has one seat, `POLICY`, and is played as before.
A frozen partner (a judge) is no seat: it is a service of the game, and its turns are no one's row.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from emoji_rl.decode.generate import Constraint
    from emoji_rl.io.endpoint import Endpoint

POLICY = "policy"
"""The seat of a game that declares none: the policy's only one. Its metrics carry no seat name."""


@dataclass(frozen=True)
class Seat:
    """A seat the policy plays: its name (turns, rows and metrics carry it) and how it samples there
    (`grammar`: emoji messages under the grammar; `none`: free text)."""

    name: str
    constraint: Constraint


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
    seat_rewards: dict[str, float] = field(default_factory=dict)
    """When `done`, in a game of several seats: each seat's terminal reward, by name (`reward` then
    repeats its first seat's). Empty in a game of one seat, whose reward is `reward`."""


class Env(ABC):
    """One episode of a game being played (tinker's `Env`): it gives the first prompt and scores each
    action against the game's fixed environment. A finished one is an `Episode`."""

    seat: Seat | None = None
    """The seat whose turn comes next, read before each turn: its observation (from `start` or the
    last `step`) extends that seat's own token sequence, and the policy samples it under the seat's
    constraint. None: the game's one seat, sampled as the sampler is set (the setup's constraint)."""

    @abstractmethod
    async def start(self) -> tuple[int, ...]:
        """The first prompt, as token ids ending with the generation prompt."""

    @abstractmethod
    async def step(self, action_ids: tuple[int, ...]) -> StepResult:
        """Score one sampled action (its token ids, stop token included when sampled)."""


@dataclass(frozen=True)
class Turn:
    """One policy turn inside its seat's token sequence."""

    observation_ids: tuple[int, ...]
    action_ids: tuple[int, ...]
    action_logprobs: tuple[float, ...]
    """The sampler's log-probs of `action_ids`, under the constraint it sampled with."""
    result: StepResult
    sampler_version: int | None = None
    """The adapter version that sampled this turn (`Sample.version`): the trainer step that published
    it; None: the weights being trained."""
    seat: str = POLICY
    """The seat that played it (`Env.seat`'s name)."""


@dataclass(frozen=True)
class Episode:
    """A finished game: turns in order and the terminal reward."""

    turns: tuple[Turn, ...]

    @property
    def reward(self) -> float:
        return self.turns[-1].result.reward

    @property
    def rewards(self) -> dict[str, float]:
        """Each seat's terminal reward, by name: a game of one seat's is `reward`, under `POLICY`."""
        final = self.turns[-1].result
        return dict(final.seat_rewards) if final.seat_rewards else {POLICY: final.reward}

    def of(self, seat: str) -> Episode:
        """The turns `seat` played, in order: its own token sequence, one training row. (Its `reward`
        is no seat's: read `rewards`.) A game of one seat is its own."""
        return Episode(tuple(turn for turn in self.turns if turn.seat == seat))

    def token_ids(self) -> tuple[int, ...]:
        """The whole episode as one sequence: obs_1 act_1 obs_2 act_2 ... act_T (of one seat: `of`)."""
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
    """The G episodes played from one prompt, seen from one seat: the unit the advantage is computed
    over. A game of several seats gives a prompt one group per seat, over the same episodes."""

    prompt_id: str
    episodes: tuple[Episode, ...]
    target: str = ""
    """What the record asks of the policy (`GameSetup.target`), for the rollout log: a rollout read
    without it cannot be judged."""
    advantages: tuple[float, ...] = ()
    """Each episode's advantage in this seat, as the update trains on it (`rl.grpo.step_advantages`,
    set by the trainer's `collect`); empty until then."""
    seat: str = POLICY
    """The seat whose rewards, advantages and rows these are."""

    def __post_init__(self) -> None:
        if self.advantages and len(self.advantages) != len(self.episodes):
            raise ValueError(
                f"group {self.prompt_id!r}: {len(self.advantages)} advantages for {len(self.episodes)} episodes"
            )

    @property
    def rewards(self) -> tuple[float, ...]:
        """Each episode's terminal reward in this seat."""
        return tuple(e.rewards[self.seat] for e in self.episodes)

    def rows(self) -> list[Episode]:
        """Each episode's turns in this seat (`Episode.of`): the rows the update trains on."""
        return [e.of(self.seat) for e in self.episodes]


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
    records, the records (`GameContext.records`), the seats the policy plays (`seats`: a game of one
    seat names how the policy samples, `grammar`: emoji messages under the grammar, of the run's
    min_emoji..max_emoji, or `none`: free text; a game of several, its `Seat`s, the first one's
    constraint being the sampler's default), a one-line description, what a record is about (its
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
    seats: tuple[Seat, ...] | Constraint
    """After construction always the `Seat`s: a constraint alone is the one seat `POLICY`'s."""
    description: str
    target: Callable[[Record], str] = lambda record: ""
    headline: tuple[str, str] | None = None
    seconds: Callable[[], dict[str, float]] = dict
    state: Stateful | None = None
    observe: Callable[[Sequence[EpisodeGroup]], None] = lambda groups: None
    held_out_metrics: HeldOutMetrics = lambda records, indices, episodes: [{} for _ in episodes]
    servers: dict[str, Endpoint] = field(default_factory=dict)
    modes: dict[str, Callable[[Record], Env]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.seats, str):
            self.seats = (Seat(POLICY, self.seats),)
        names = [seat.name for seat in self.seats]
        if not names or len(set(names)) != len(names) or any(not name for name in names):
            raise ValueError(f"a game's seats need distinct non-empty names, got {names}")
        if len(names) > 1 and POLICY in names:
            raise ValueError(f"{POLICY!r} is the seat of a game of one: name each of {names} for its part")

    @property
    def constraint(self) -> Constraint:
        """How the policy samples where a game's seat does not say (`Env.seat` None): the first seat's."""
        return self.seats[0].constraint

    @property
    def seated(self) -> bool:
        """Whether the policy plays several seats: then rows, advantages and metrics are per seat."""
        return len(self.seats) > 1

    def games(self) -> dict[str, Callable[[Record], Env]]:
        """The game's modes by name, in the order a report shows them (`modes`, or the game itself)."""
        return self.modes or {"multi": self.make_env}
