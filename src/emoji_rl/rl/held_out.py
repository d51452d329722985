"""Held-out evaluation inside GRPO (`eval_steps`, `eval_before_train`): the policy being trained plays
its game greedily on held-out records, in process, every process its share, and the step's line of
metrics.jsonl gets the mean over the records of the game's own final metrics as `eval/...`
(`eval/reward/mean`, or each seat's `eval/reward/SEAT/mean` where the policy plays several,
`eval/turns`, each key the game's last turn reports, over the records that report it) and of what
its eval stage compares beyond them (`GameSetup.held_out_metrics`: a rank among distractors, a win rate). The eval
stages (play/evaluate.py) add what needs more than the training game: baselines, other systems,
intervals.

The reward and its terms are named as the training line names them (`reward/mean` beside
`reward/contrast/mean`): `eval/reward/mean` beside `eval/reward/contrast/mean`. Until #62 they were
`eval/reward` beside `eval/reward/contrast`, which mlflow's file store cannot hold together (a metric is
a file there, and the second needs a folder of the same name); `current_names` reads such a line.

An evaluation belongs to the step after whose update it runs (0: before the first), in that step's
line, so a resume from a checkpoint never redoes one: the steps it redoes were not logged."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emoji_rl.decode.sampler import Sampler
from emoji_rl.lm.distributed import gather
from emoji_rl.play.loop import play
from emoji_rl.play.spec import read_game_records
from emoji_rl.play.types import Episode, GameSetup, Record

if TYPE_CHECKING:
    from emoji_rl.rl.train_config import TrainConfig


def held_out_records(cfg: TrainConfig) -> list[Record] | None:
    """The records the held-out evaluation plays (None: `eval_steps` and `eval_before_train` ask for
    none): eval_data's first `eval_max_examples`, read the game's way (`GameConfig.read_records`: the
    stage's Config is its game's config too), so that another game's records are refused; an error
    names eval_data. The stage reads them before any model loads or anything is written, and again
    where it builds the evaluation."""
    if not (cfg.eval_steps or cfg.eval_before_train):
        return None
    assert cfg.eval_data is not None  # TrainConfig checks it
    records = read_game_records(cfg, "eval_data", cfg.eval_data, cfg)  # type: ignore[arg-type]
    return records[: cfg.eval_max_examples or None]


@dataclass
class HeldOut:
    records: list[Record]
    setup: GameSetup
    sampler: Sampler
    """Greedy, on the policy being trained (an HFSampler over the same weights)."""
    rank: int
    world: int
    every: int
    before_train: bool

    def due(self, step: int) -> bool:
        """Whether the evaluation runs after optimizer step `step` (0: before the first)."""
        if step == 0:
            return self.before_train
        return self.every > 0 and step % self.every == 0

    def run(self) -> dict[str, float]:
        """Every process plays an equal share (the last record fills the shares out, so that sharded
        weights see the same passes on every process), and all see the means of the records once each,
        with the seconds it took (`time/eval_s`)."""
        start = time.perf_counter()
        indices = list(range(len(self.records)))
        indices += indices[-1:] * (-len(indices) % self.world)
        mine = indices[self.rank :: self.world]
        episodes = asyncio.run(play([self.setup.make_env(self.records[i]) for i in mine], self.sampler))
        compared = self.setup.held_out_metrics(self.records, mine, episodes)
        scored = [
            (i, {**self._rewards(e), "turns": float(len(e.turns)), **e.turns[-1].result.metrics, **more})
            for i, e, more in zip(mine, episodes, compared, strict=True)
        ]
        once = dict(pair for part in gather(scored) for pair in part)
        values: dict[str, list[float]] = defaultdict(list)
        for metrics in once.values():
            for key, value in metrics.items():
                values[key].append(float(value))
        means = {eval_name(key): sum(v) / len(v) for key, v in sorted(values.items())}
        return {**means, "time/eval_s": time.perf_counter() - start}

    def _rewards(self, episode: Episode) -> dict[str, float]:
        """`reward`, or where the policy plays several seats each one's, as `reward/SEAT`: logged as
        `eval/reward/SEAT/mean`, beside the training line's `reward/SEAT/mean`."""
        if not self.setup.seated:
            return {"reward": episode.reward}
        return {f"reward/{seat}": reward for seat, reward in episode.rewards.items()}


def eval_name(key: str) -> str:
    """The held-out mean of an episode's metric `key` as the step's line names it: the reward and each
    of its terms (`reward/<term>`) end in `/mean`, so no name is the folder of another."""
    return f"eval/{key}/mean" if key == "reward" or key.startswith("reward/") else f"eval/{key}"


def current_names(line: dict) -> dict:
    """A metrics.jsonl line with the held-out names of a run from before #62 (`eval/reward` beside
    `eval/reward/<term>`) as they are now; any other line as it is. A line of that time always holds
    `eval/reward` where it holds an evaluation, and a line of now never does."""
    if "eval/reward" not in line:
        return line

    def renamed(key: str) -> str:
        reward = key == "eval/reward" or key.startswith("eval/reward/")
        return eval_name(key.removeprefix("eval/")) if reward else key

    return {renamed(key): value for key, value in line.items()}
