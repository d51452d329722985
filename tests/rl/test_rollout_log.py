"""What a step's rollouts report: rollouts.jsonl and `emoji-rl debug-rollout` show what each group's
sender was trying to say; metrics.jsonl counts the emoji sent."""

from __future__ import annotations

import asyncio
import json

import pytest

from emoji_rl import cli
from emoji_rl.decode.sampler import Sample
from emoji_rl.io.jsonl import AppendLog
from emoji_rl.play.types import Env, GameSetup, StepResult
from emoji_rl.rl.checkpoint import TrainState
from emoji_rl.rl.rollout.collect import Baselines, PromptStream, collect
from emoji_rl.rl.rollout.metrics import log_rollouts, rollout_metrics


class OneTurnEnv(Env):
    """Rewards the sender's first token id, logs it as the emoji: no model, no judge."""

    async def start(self):
        return (1, 2)

    async def step(self, action_ids):
        return StepResult(True, float(action_ids[0]), metrics={"similarity": 0.1}, log={"emoji": "🍕 🌙"})


def run_collect(stream, sampler, **kwargs):
    """collect() of the one-turn game; a record's target is its `target` or its `answer`."""
    game = GameSetup(lambda record: OneTurnEnv(), list(stream.records), "none", "one turn", target=_target)
    return asyncio.run(collect(stream, game, sampler, **kwargs))


def _target(record):
    return record.get("target") or record["answer"]


class ListSampler:
    """Answers the i-th game of a call with token id `ids[i]`: rewards chosen per episode."""

    def __init__(self, ids):
        self.ids = ids

    async def sample(self, prompts, previous=None):
        return [Sample((self.ids[i],), (-0.5,)) for i in range(len(prompts))]


def test_each_rollout_record_names_its_target_and_debug_rollout_prints_it(tmp_path, capsys):
    records = [{"id": "p0", "target": "let's get pizza tonight"}, {"id": "p1", "answer": "crane"}]
    stream = PromptStream(records, seed=0, state=TrainState(), gather_counts=lambda n: [n])
    sampler = ListSampler([0, 1, 0, 1])
    rollouts = run_collect(stream, sampler, batch_size=2, group_size=2, baselines=Baselines("group"))
    assert {g.prompt_id: g.target for g in rollouts.played} == {
        "p0": "let's get pizza tonight",
        "p1": "crane",
    }

    run = tmp_path / "grpo"
    with AppendLog(run / "rollouts.jsonl") as log:
        log_rollouts(log, 1, rollouts.played, [0, 1])
    logged = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["prompt_id"], r["target"]) for r in logged] == [
        (g.prompt_id, g.target) for g in rollouts.played for _ in g.episodes
    ]
    # the process that played each group (here as if two had played one each)
    assert [r["rank"] for r in logged] == [0, 0, 1, 1]
    # each episode's advantage as collect stored it for the update: rewards 0, 1 in each group
    assert [r["advantage"] for r in logged] == [a for g in rollouts.played for a in g.advantages]
    assert [r["advantage"] for r in logged] == pytest.approx([-0.7071, 0.7071] * 2, abs=1e-4)

    assert cli.main(["debug-rollout", "--run", str(run)]) == 0
    grouped = capsys.readouterr().out
    assert '=== group p0: target "let\'s get pizza tonight"' in grouped
    assert "=== group p1: target 'crane'" in grouped
    # each turn as the game logged it: its text fields and its numbers, whatever the game
    assert "  turn 1: similarity 0.100" in grouped and "    emoji: 🍕 🌙" in grouped
    # Sorted by reward, episodes leave their groups: each shows its own target.
    assert cli.main(["debug-rollout", "--run", str(run), "--sort", "best", "--limit", "1"]) == 0
    best = capsys.readouterr().out
    assert "rollout 1: reward +1.000" in best and "  target " in best


def test_step_metrics_count_the_emoji_sent():
    records = [{"id": "p0", "target": "let's get pizza tonight"}]
    stream = PromptStream(records, seed=0, state=TrainState(), gather_counts=lambda n: [n])
    sampler = ListSampler([0, 1, 0])  # rewards 0, 1, 0
    rollouts = run_collect(stream, sampler, batch_size=1, group_size=3, baselines=Baselines("group"))
    metrics = rollout_metrics(rollouts.played, rollouts.kept)
    # three messages of 🍕 🌙: 2 distinct emoji, used equally (1 bit), 2 a message
    assert (metrics["emoji/distinct"], metrics["emoji/entropy_bits"], metrics["emoji/per_message"]) == (
        2,
        1,
        2,
    )
    assert metrics["game/similarity"] == pytest.approx(0.1)


def test_step_metrics_average_each_groups_best_reward():
    records = [{"id": "p0", "target": "pizza"}, {"id": "p1", "target": "moon"}]
    stream = PromptStream(records, seed=0, state=TrainState(), gather_counts=lambda n: [n])
    sampler = ListSampler([0, 1, 0, 2, 3, 2])  # rewards: group 0, 1, 0 and group 2, 3, 2
    rollouts = run_collect(stream, sampler, batch_size=2, group_size=3, baselines=Baselines("group"))
    metrics = rollout_metrics(rollouts.played, rollouts.kept)
    # mean 8/6; the groups' best 1 and 3 average 2 (the best of all episodes would be 3)
    assert metrics["reward/mean"] == pytest.approx(8 / 6)
    assert metrics["reward/group_best"] == pytest.approx(2.0)
