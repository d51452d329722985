"""A step of a game that seats the policy twice (docs/DESIGN.md §14): one group per (prompt, seat), each
seat's advantages against its own baseline (its groups' means, or its moving average), metrics and
rollout records per seat, and the trainer's rows: each episode's turns in each seat."""

from __future__ import annotations

import asyncio

import pytest
from tests.play.test_seats import READER, SENDER

from emoji_rl.decode.sampler import Sample
from emoji_rl.io.jsonl import AppendLog, read_jsonl
from emoji_rl.io.metrics import folder_clashes
from emoji_rl.play.types import Env, GameSetup, StepResult
from emoji_rl.rl import grpo
from emoji_rl.rl.batch import collate_groups
from emoji_rl.rl.checkpoint import TrainState
from emoji_rl.rl.debug_rollout import format_episode
from emoji_rl.rl.rollout.collect import Baselines, PromptStream, collect
from emoji_rl.rl.rollout.metrics import episode_table, log_rollouts, rollout_metrics


class SendThenRead(Env):
    """One round: the sender's turn (rewarded its token / 10), then the reader's (rewarded 10 x its
    token): two reward scales a hundred-fold apart."""

    async def start(self):
        self.seat = SENDER
        return (1, 2)

    async def step(self, action_ids):
        if self.seat is SENDER:
            self.sent = action_ids[0]
            self.seat = READER
            return StepResult(False, 0.0, (3,), log={"emoji": "🍕 🌙"})
        rewards = {"sender": self.sent / 10, "reader": 10.0 * action_ids[0]}
        return StepResult(True, rewards["sender"], seat_rewards=rewards, metrics={"judge_similarity": 0.5})


class Script:
    """The i-th prompt of a seat's call gets token `tokens[seat][i]`."""

    def __init__(self, tokens):
        self.tokens = tokens

    async def sample(self, prompts, previous=None, *, constraint=None):
        seat = "sender" if constraint == "grammar" else "reader"
        return [Sample((self.tokens[seat][i],), (-0.5,)) for i in range(len(prompts))]


RECORDS = [{"id": "p0", "target": "pizza"}, {"id": "p1", "target": "rain"}]


def step(tokens, baselines, state=None):
    setup = GameSetup(lambda r: SendThenRead(), RECORDS, (SENDER, READER), "send then read")
    stream = PromptStream(RECORDS, seed=0, state=state or TrainState(), gather_counts=lambda n: [n])
    return asyncio.run(collect(stream, setup, Script(tokens), 2, 2, baselines)), setup


def test_each_seat_has_its_groups_advantages_and_metrics(tmp_path):
    # The first prompt's two episodes, then the second's: the sender's tokens 1 3 | 2 2 (the second
    # prompt's flat), the reader's 1 2 | 3 5.
    tokens = {"sender": [1, 3, 2, 2], "reader": [1, 2, 3, 5]}
    played, setup = step(tokens, Baselines("batch"))
    first, second = played.played[0].prompt_id, played.played[2].prompt_id
    assert [(g.prompt_id, g.seat) for g in played.played] == [
        (first, "sender"),
        (first, "reader"),
        (second, "sender"),
        (second, "reader"),
    ]
    rewards = [g.rewards for g in played.played]
    assert rewards == [(0.1, 0.3), (10.0, 20.0), (0.2, 0.2), (30.0, 50.0)]
    # Each seat against its own: the sender's advantages are as large as the reader's though its
    # rewards are a hundred times smaller; the flat sender group is not kept.
    advantages = grpo.seat_advantages(rewards, [g.seat for g in played.played], "batch")
    assert [g.advantages for g in played.played] == advantages
    assert advantages[0][1] == pytest.approx(1 / 2**0.5, rel=1e-4)
    assert [(g.prompt_id, g.seat) for g in played.kept] == [
        (first, "sender"),
        (first, "reader"),
        (second, "reader"),
    ]

    metrics = rollout_metrics(played.played, played.kept)
    assert metrics["reward/sender/mean"] == pytest.approx(0.2)
    assert metrics["reward/reader/mean"] == pytest.approx(27.5)
    assert metrics["group/sender/frac_zero_std"] == 0.5 and metrics["group/reader/kept"] == 2.0
    assert metrics["group/played"] == 2.0 and metrics["game/judge_similarity"] == 0.5
    assert metrics["tokens/sampled"] == 8.0  # every episode's two turns, once
    assert "reward/mean" not in metrics
    # No name is a folder of another's (mlflow's file store keeps each metric in a file of its name).
    assert folder_clashes(metrics) == []

    with AppendLog(tmp_path / "rollouts.jsonl") as log:
        log_rollouts(log, 1, played.played, [0] * 4)
    logged = read_jsonl(tmp_path / "rollouts.jsonl")
    assert [(r["seat"], r["reward"]) for r in logged[:4]] == [
        ("sender", 0.1),
        ("sender", 0.3),
        ("reader", 10.0),
        ("reader", 20.0),
    ]
    assert [len(r["turns"]) for r in logged] == [1] * 8  # each record holds its seat's turns
    assert "emoji" in logged[0]["turns"][0] and "emoji" not in logged[2]["turns"][0]
    assert [row[2] for row in episode_table(logged, 3)] == ["0 (sender)", "1 (sender)", "0 (reader)"]
    assert format_episode(logged[2]).startswith(f"prompt {first} rollout 0 (reader): reward +10.000")

    rows = collate_groups(played.kept, 0, None, seats=setup.seats)
    assert rows.input_ids_D_T.tolist() == [[1, 2, 1], [1, 2, 3], [3, 1, 0], [3, 2, 0], [3, 3, 0], [3, 5, 0]]
    assert rows.advantages_D.tolist() == pytest.approx([a for g in played.kept for a in g.advantages])


def test_a_moving_baseline_per_seat_carries_a_flat_groups_signal_and_moves_on():
    tokens = {"sender": [2, 2, 2, 2], "reader": [1, 1, 3, 3]}  # every group flat
    baselines = Baselines("none", "ema", 0.5)
    first, _ = step(tokens, baselines)
    # Step 1 is measured against its own means (sender 0.2, reader 20), which start the averages.
    assert [a for g in first.played for a in g.advantages] == pytest.approx([0, 0, -10, -10, 0, 0, 10, 10])
    assert len(first.kept) == 4 and baselines.values == pytest.approx({"sender": 0.2, "reader": 20.0})
    second, _ = step({"sender": [4, 4, 4, 4], "reader": [1, 1, 1, 1]}, baselines)
    assert [a for g in second.played for a in g.advantages] == pytest.approx([0.2, 0.2, -10, -10] * 2)
    assert baselines.values == pytest.approx({"sender": 0.3, "reader": 15.0})


def test_a_seat_that_got_no_reward_is_named():
    class Forgets(SendThenRead):
        async def step(self, action_ids):
            result = await super().step(action_ids)
            return StepResult(True, 1.0, seat_rewards={"sender": 1.0}) if result.done else result

    setup = GameSetup(lambda r: Forgets(), RECORDS, (SENDER, READER), "forgetful")
    stream = PromptStream(RECORDS, seed=0, state=TrainState(), gather_counts=lambda n: [n])
    tokens = {"sender": [1] * 4, "reader": [1] * 4}
    with pytest.raises(ValueError, match="forgetful: an episode gave seat 'reader' no terminal reward"):
        asyncio.run(collect(stream, setup, Script(tokens), 2, 2, Baselines()))


def test_a_step_that_kept_only_free_text_rows_trains_them_as_free_text(smollm2_tokenizer):
    from emoji_rl.emoji.constraint import compile_emoji_grammar

    tokens = {"sender": [2, 2, 2, 2], "reader": [1, 2, 3, 5]}  # the sender's groups flat: not kept
    played, setup = step(tokens, Baselines("group"))
    assert {g.seat for g in played.kept} == {"reader"}
    batch = collate_groups(played.kept, 0, compile_emoji_grammar(smollm2_tokenizer), seats=setup.seats)
    assert batch.support is None and batch.constrained_D is None and batch.allowed_N_S == []
