"""Both seats with a scripted policy, a scripted judge and scripted scores: no model runs. The sender
writes in the sender's chat, the reader reads in the judge's, the judge's guess decides, and each seat
gets its own reward (docs/DESIGN.md §15)."""

from __future__ import annotations

import asyncio
import json

import pytest
from tests.games.scripted import ScriptedSampler

from emoji_rl.emoji.sender_prompts import correction_message, sender_messages
from emoji_rl.games.both_seats.game import TEACHER, BothSeatsBuilder, BothSeatsRules, reads_teacher
from emoji_rl.lm import template
from emoji_rl.play.evaluation import EvalConfig
from emoji_rl.play.guessing import Guess, JudgeInput, judge_messages
from emoji_rl.play.judge import Judge
from emoji_rl.play.loop import play
from emoji_rl.play.reward import RewardWeights, reader_reward, terminal_reward

TARGET = "Let's get pizza and watch a movie tonight"
RECORD = {"id": "m0", "target": TARGET}
# What each guess scores against TARGET: (similarity, background).
SCORES = {
    "Pizza.": (0.3, 0.1),
    "Pizza night": (0.5, 0.2),
    "A movie.": (0.4, 0.1),
    "Pizza and a movie tonight": (0.9, 0.2),
    "Film at home": (0.6, 0.3),
    "[unknown]": (0.05, 0.05),  # a guess with no words left once its emoji are stripped
}


class ScriptedJudge(Judge):
    def __init__(self, guesses):
        self.guesses, self.asked = guesses, []

    async def guess(self, episodes):
        self.asked += episodes
        return [Guess(self.guesses[len(self.asked) - len(episodes) + i], "raw") for i in range(len(episodes))]

    def describe(self):
        return "scripted"


class Scores:
    seconds = 0.0

    async def __call__(self, pair):
        assert pair[0] == TARGET
        return SCORES[pair[1]]


def build(tokenizer, judge_guesses, share=0.0, **rules):
    rules = BothSeatsRules(**{"tau": 0.85, "judge_weight": 0.75, **rules})
    return BothSeatsBuilder(tokenizer, ScriptedJudge(judge_guesses), Scores(), rules, share, seed=0)


def test_the_sender_writes_the_reader_reads_and_the_judges_guess_decides(smollm2_tokenizer):
    builder = build(smollm2_tokenizer, ["Pizza.", "Pizza and a movie tonight"], max_turns=3)
    policy = ScriptedSampler(smollm2_tokenizer, ["🍕 🍕", "Pizza night", "🍕 🎬", "Film at home"])
    [episode] = asyncio.run(play([builder(RECORD)], policy))
    assert policy.constraints == ["grammar", "none", "grammar", "none"]
    assert [t.seat for t in episode.turns] == ["sender", "reader", "sender", "reader"]
    sent, guessed = policy.samples[0][0].token_ids, policy.samples[1][0].token_ids
    # The sender's chat: its prompt, its message, the judge's guess (not its own reader's) to correct.
    sender_chat = [
        *sender_messages(TARGET),
        {"role": "assistant", "content": "🍕 🍕"},
        correction_message("Pizza.", TARGET),
    ]
    assert policy.prompts[2][0] == tuple(template.chat_ids(smollm2_tokenizer, sender_chat))
    # The reader's chat is the judge's, its own guesses as its turns, and none of the sender's tokens.
    reader_chat = judge_messages(JudgeInput((("🍕", "🍕"), ("🍕", "🎬")), ("Pizza night",)), "gloss")
    assert policy.prompts[3][0] == tuple(template.chat_ids(smollm2_tokenizer, reader_chat))
    assert episode.of("sender").token_ids()[: len(policy.prompts[2][0])] == policy.prompts[2][0]
    assert sent not in [episode.of("reader").token_ids()[i : i + len(sent)] for i in range(100)]
    assert guessed == episode.of("reader").turns[0].action_ids
    # The judge read both messages; its second guess reached tau: the game ends after that round.
    assert [e.turns for e in builder.judge.asked] == [(("🍕", "🍕"),), (("🍕", "🍕"), ("🍕", "🎬"))]
    result = episode.turns[-1].result
    weights = RewardWeights()
    sender = terminal_reward(0.75 * 0.9 + 0.25 * 0.6, 2, False, 2, 4, 0.85, weights, 0.75 * 0.2 + 0.25 * 0.3)
    assert result.seat_rewards == pytest.approx(
        {"sender": sender["total"], "reader": reader_reward(0.6, 0.3, 0.0)["total"]}
    )
    assert result.reward == result.seat_rewards["sender"]
    metrics = result.metrics
    assert metrics["judge_similarity"] == 0.9 and metrics["pair_similarity"] == 0.6
    assert metrics["drift"] == pytest.approx(0.6 - 0.9) and "teacher_similarity" not in metrics
    assert metrics["turns"] == 2.0 and metrics["success@0.85"] == 1.0 and metrics["reader_unknown"] == 0.0


def test_a_reader_that_answers_in_emoji_says_nothing_and_is_counted(smollm2_tokenizer):
    """What an emoji SFT adapter does in the reader's seat: its guess is emoji only, [unknown] once
    they are stripped, whatever it read; the game's `reader_unknown` and the evaluation's row say so."""
    from emoji_rl.games.both_seats.evaluation import summarize

    builder = build(smollm2_tokenizer, ["Pizza."], max_turns=1)
    policy = ScriptedSampler(smollm2_tokenizer, ["🍕 🍕", "🍕 🎬"])
    [episode] = asyncio.run(play([builder(RECORD)], policy))
    result = episode.turns[-1].result
    assert result.log["guess"] == "[unknown]" and result.metrics["reader_unknown"] == 1.0
    assert result.metrics["reader_similarity"] == 0.05 and result.metrics["reader_emoji_stripped"] == 1.0
    spoke = {"turns": [{"judge_guess": "[unknown]"}, {"guess": "Pizza."}], "metrics": result.metrics}
    silent = {"turns": [{"judge_guess": "Pizza."}, {"guess": "[unknown]"}], "metrics": result.metrics}
    # The row's share is read from the logged guesses: the reader's, not the judge's.
    assert summarize([spoke, silent, silent], EvalConfig())["reader_unknown"] == pytest.approx(2 / 3)


def test_on_a_teacher_record_the_reader_reads_the_teachers_emoji_and_the_judge_alone_pays_the_sender(
    smollm2_tokenizer,
):
    builder = build(smollm2_tokenizer, ["Pizza."], share=1.0, max_turns=1)
    policy = ScriptedSampler(smollm2_tokenizer, ["🍕 🍕", "A movie."])
    [episode] = asyncio.run(play([builder({**RECORD, TEACHER: ["🎬", "🌙"]})], policy))
    reader_chat = judge_messages(JudgeInput((("🎬", "🌙"),)), "gloss")
    assert policy.prompts[1][0] == tuple(template.chat_ids(smollm2_tokenizer, reader_chat))
    assert [e.turns for e in builder.judge.asked] == [(("🍕", "🍕"),)]  # the judge reads the sender's
    result = episode.turns[-1].result
    sender = terminal_reward(0.3, 1, False, 1, 2, 0.85, RewardWeights(), 0.1)  # the judge's reading alone
    assert result.seat_rewards["sender"] == pytest.approx(sender["total"])
    assert result.metrics["teacher_similarity"] == 0.4
    assert "pair_similarity" not in result.metrics and "drift" not in result.metrics


def test_a_message_cut_off_is_still_read_then_the_game_ends(smollm2_tokenizer):
    builder = build(smollm2_tokenizer, ["Pizza."], max_turns=3)
    cut = ScriptedSampler(smollm2_tokenizer, ["🍕 🍕", "Pizza night", "🍕 🎬", "A movie."])
    episodes = asyncio.run(play([builder(RECORD)], _cut_third_turn(cut)))
    result = episodes[0].turns[-1].result
    assert len(episodes[0].turns) == 4 and result.metrics["format_violation"] == 1.0
    # The sender is paid for its last valid round (judge 0.3, its reader 0.5), less the format penalty;
    # the reader for what it read last.
    sender = terminal_reward(
        0.75 * 0.3 + 0.25 * 0.5, 2, True, 2, 4, 0.85, RewardWeights(), 0.75 * 0.1 + 0.25 * 0.2
    )
    assert result.seat_rewards == pytest.approx({"sender": sender["total"], "reader": 0.4})
    assert len(builder.judge.asked) == 1  # the judge never read the broken message


def _cut_third_turn(sampler):
    async def sample(prompts, previous=None, *, constraint=None):
        samples = await ScriptedSampler.sample(sampler, prompts, previous, constraint=constraint)
        if len(sampler.prompts) == 3:  # no end of turn: cut off by the token budget
            samples = [type(s)(s.token_ids[:-1], s.logprobs[:-1]) for s in samples]
        return samples

    sampler.sample = sample
    return sampler


def test_a_teacher_record_is_drawn_once_by_its_id():
    records = [{"id": f"m{i}", "target": f"t{i}"} for i in range(400)]
    drawn = [reads_teacher(r, 0.25, seed=3) for r in records]
    assert drawn == [reads_teacher(r, 0.25, seed=3) for r in records]
    assert 0.18 < sum(drawn) / len(drawn) < 0.32
    assert drawn != [reads_teacher(r, 0.25, seed=4) for r in records]


def test_the_records_carry_the_teachers_emoji_read_before_any_model(tmp_path):
    """grpo and eval read a game's records before any model loads: both seats' join the teacher's
    emoji (an SFT split, by target) to theirs there, and a broken teacher_data is named."""
    from types import SimpleNamespace

    from emoji_rl.errors import UserError
    from emoji_rl.games.both_seats.spec import Config

    records, split = tmp_path / "rl_train.jsonl", tmp_path / "sft_train.jsonl"
    records.write_text('{"id": "m0", "target": "pizza"}\n{"id": "m1", "target": "rain"}\n')
    answer = [{"role": "user", "content": "pizza"}, {"role": "assistant", "content": "🍕 🎬"}]
    split.write_text(json.dumps({"target": "pizza", "messages": answer}) + "\n")
    stage = SimpleNamespace(min_emoji=2, max_emoji=8)
    read = Config(teacher_data=str(split)).read_records(str(records), stage)
    assert read == [{"id": "m0", "target": "pizza", TEACHER: ["🍕", "🎬"]}, {"id": "m1", "target": "rain"}]
    assert Config().read_records(str(records), stage) == [
        {"id": "m0", "target": "pizza"},
        {"id": "m1", "target": "rain"},
    ]
    split.write_text('{"target": "pizza"}\n')
    with pytest.raises(UserError, match=f"teacher_data={split}: .*sft_train.jsonl:1"):
        Config(teacher_data=str(split)).read_records(str(records), stage)


def test_the_teacher_mode_refuses_held_out_records_the_teacher_has_no_emoji_for():
    """Their reader would read the system's own emoji, counted in the teacher's row."""
    from types import SimpleNamespace

    from emoji_rl.errors import UserError
    from emoji_rl.games.both_seats.evaluation import plan

    cfg = SimpleNamespace(data="held_out.jsonl", teacher_data="sft_train.jsonl")
    game = SimpleNamespace(games=lambda: {"pair": None, "teacher": None})
    records = [{"target": "pizza", TEACHER: ["🍕", "🎬"]}, {"target": "rain"}]
    with pytest.raises(UserError, match=r"mode teacher: 1 of the 2 held-out records in data=held_out\.jsonl"):
        plan(cfg, game, records, tokenizer=None)
