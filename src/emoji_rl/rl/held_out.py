"""Held-out evaluation inside GRPO (`eval_steps`, `eval_before_train`): the policy being trained plays
its game greedily on held-out records, in process, every process its share, and the step's line of
metrics.jsonl gets the mean over the records of the game's own final metrics as `eval/...`
(`eval/reward`, or each seat's `eval/SEAT/reward` where the policy plays several, `eval/turns`, each
key the game's last turn reports, over the records that report it) and of what its eval stage
compares beyond them (`GameSetup.held_out_metrics`: a rank among distractors, a win rate). The eval
stages (game/evaluate.py) add what needs more than the training game: baselines, other systems,
intervals.

An evaluation belongs to the step after whose update it runs (0: before the first), in that step's
line, so a resume from a checkpoint never redoes one: the steps it redoes were not logged."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass

from emoji_rl.decode.sampler import Sampler
from emoji_rl.game.play import play
from emoji_rl.game.types import Episode, GameSetup, Record
from emoji_rl.lm.distributed import gather


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
        episodes = asyncio.run(play([self.setup.make_game(self.records[i]) for i in mine], self.sampler))
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
        means = {f"eval/{key}": sum(v) / len(v) for key, v in sorted(values.items())}
        return {**means, "time/eval_s": time.perf_counter() - start}

    def _rewards(self, episode: Episode) -> dict[str, float]:
        """`reward`, or where the policy plays several seats each one's, as `SEAT/reward`."""
        if not self.setup.seated:
            return {"reward": episode.reward}
        return {f"{seat}/reward": reward for seat, reward in episode.rewards.items()}
