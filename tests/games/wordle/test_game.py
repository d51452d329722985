"""The Wordle game on the shared protocol: cumulative feedback, invalid guesses cost a turn with a
reason, each reward term on hand-worked boards, and the curriculum switching phase."""

import asyncio
import logging
import math
from collections import Counter

import pytest

from emoji_rl.games.wordle.game import WordleBuilder, WordleRules
from emoji_rl.games.wordle.reward import (
    FORMAT_PHASE,
    STRATEGY_PHASE,
    Curriculum,
    CurriculumTracker,
    TurnScore,
    WordleWeights,
    episode_terms,
)
from emoji_rl.games.wordle.rules import consistent, feedback, load_word_lists
from emoji_rl.lm.template import stop_token_id


def reply_ids(tokenizer, text, stop=True):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return (*ids, stop_token_id(tokenizer)) if stop else tuple(ids)


def play(game, tokenizer, replies):
    asyncio.run(game.start())
    results = []
    for text in replies:
        results.append(asyncio.run(game.step(reply_ids(tokenizer, text))))
        if results[-1].done:
            break
    return results


def strict(word):
    return f"<think>reasoning</think><guess>{word}</guess>"


def entropy_share(guess, candidates):
    counts = Counter(feedback(a, guess) for a in candidates).values()
    n = len(candidates)
    return -sum(c / n * math.log2(c / n) for c in counts) / math.log2(n)


def test_board_is_cumulative_and_invalid_guesses_cost_a_turn(smollm2_tokenizer):
    game = WordleBuilder(smollm2_tokenizer, WordleRules())({"answer": "above"})
    results = play(
        game, smollm2_tokenizer, [strict("crane"), "I think crane", strict("xyzzy"), "<guess>boons</guess>"]
    )
    assert [r.done for r in results] == [False, False, False, False]
    last = smollm2_tokenizer.decode(results[-1].next_observation_ids)
    assert "Guess 1: crane -> C(x) R(x) A(-) N(x) E(✓)" in last
    assert "Guess 2: I think crane -> invalid: no <guess>…</guess> tag in the reply" in last
    assert "Guess 3: xyzzy -> invalid: 'xyzzy' is not in the word list" in last
    assert "Guess 4: boons -> B(-) O(x) O(✓) N(x) S(x) (format: write <think>" in last
    assert "You have 2 guesses left" in last
    assert [r.log["feedback"].split(" -> ")[0] for r in results] == [
        "crane",
        "I think crane",
        "xyzzy",
        "boons",
    ]


def test_cut_off_reply_is_invalid_and_the_chat_stays_well_formed(smollm2_tokenizer):
    game = WordleBuilder(smollm2_tokenizer, WordleRules())({"answer": "above"})
    asyncio.run(game.start())
    result = asyncio.run(game.step(reply_ids(smollm2_tokenizer, "<think>hmm, let me", stop=False)))
    assert not result.done and "no <guess>" in result.log["feedback"]
    assert result.next_observation_ids[0] == stop_token_id(smollm2_tokenizer)


def test_each_reward_term_on_a_hand_worked_board(smollm2_tokenizer):
    weights = WordleWeights()
    game = WordleBuilder(smollm2_tokenizer, WordleRules(weights=weights))({"answer": "above"})
    results = play(game, smollm2_tokenizer, [strict("soare"), strict("soare"), "<guess>above</guess>"])
    final = results[-1]
    assert final.done and final.metrics["won"] == 1.0 and final.metrics["turns"] == 3
    words = load_word_lists()
    board = [("soare", feedback("above", "soare"))]
    left = [a for a in words.answers if consistent(a, board)]  # 8 words, by hand: x - - x ✓
    expected = {
        "correct": 1.0,
        "early": 1 / 3,
        "format": 0.2 * 2 / 3,  # the last reply has no <think>
        "consistency": 0.5 * 2 / 3,  # the repeated soare contradicts its own feedback
        "length": 0.1,
        # turn 2: S R absent, O A back on their yellow spots, E kept: (-1-1-1-1+1)/5;
        # turn 3: A O moved (+0.5 each), B V untried (+0.25 each), E kept (+1)
        "feedback_use": 0.2 * ((-3 / 5) + (2.5 / 5)) / 2,
        "info_gain": 0.2 * (entropy_share("soare", words.answers) + 0.0 + entropy_share("above", left)) / 3,
        "repeat": -0.5 / 3,
    }
    assert len(left) == 8
    for name, value in expected.items():
        assert final.metrics[f"reward/{name}"] == pytest.approx(value), name
    assert final.reward == pytest.approx(sum(expected.values()))
    assert final.metrics["repeat_rate"] == pytest.approx(1 / 3)
    assert final.metrics["format_rate"] == pytest.approx(2 / 3)


def test_a_lost_game_scores_no_win_terms(smollm2_tokenizer):
    game = WordleBuilder(smollm2_tokenizer, WordleRules(max_turns=2))({"answer": "above"})
    results = play(game, smollm2_tokenizer, ["no tags", "<think>x</think><guess>cran</guess>"])
    final = results[-1]
    assert final.done and final.metrics["won"] == 0.0 and final.metrics["invalid_rate"] == 1.0
    terms = {k.removeprefix("reward/"): v for k, v in final.metrics.items() if k.startswith("reward/")}
    # Only the second reply is strict; neither guess is a readable five-letter word.
    assert terms == pytest.approx(
        {"correct": 0, "early": 0, "format": 0.1, "consistency": 0, "length": 0, "feedback_use": 0}
        | {"info_gain": 0, "repeat": 0, "total": 0.1}
    )


def test_episode_terms_average_per_turn_terms():
    turn = TurnScore("crane", True, True, True, None, 0.5, False)
    repeat = TurnScore("crane", True, True, False, 0.25, 0.0, True)
    terms = episode_terms([turn, repeat], solved=False, weights=WordleWeights(repeat=1.0))
    assert terms["repeat"] == pytest.approx(-0.5)
    assert terms["feedback_use"] == pytest.approx(0.2 * 0.25)
    assert terms["info_gain"] == pytest.approx(0.2 * 0.25)
    assert terms["total"] == pytest.approx(sum(v for k, v in terms.items() if k != "total"))


def test_curriculum_switches_once_format_is_learned(caplog):
    curriculum = Curriculum(threshold=0.9, window=4)
    assert curriculum.next_phase(0, 0.89) == 0 and curriculum.next_phase(0, 0.9) == 1
    assert curriculum.next_phase(1, 1.0) == 1  # the last phase stays
    tracker = CurriculumTracker(curriculum)
    for share in (1.0, 1.0, 1.0, 0.5):  # 0.875 < 0.9
        tracker.record(share)
    assert tracker.phase == 0
    with caplog.at_level(logging.INFO):
        tracker.record(1.0)  # window now 1, 1, 0.5, 1 -> 0.875
        tracker.record(1.0)  # 1, 0.5, 1, 1 -> 0.875
        tracker.record(1.0)  # 0.5, 1, 1, 1 -> 0.875
        assert tracker.phase == 0
        tracker.record(1.0)  # 1, 1, 1, 1 -> 1.0
    assert tracker.phase == 1 and tracker.weights == STRATEGY_PHASE
    assert "phase 0 -> 1" in caplog.text
    assert STRATEGY_PHASE.format < WordleWeights().format
    assert STRATEGY_PHASE.info_gain > WordleWeights().info_gain


def test_a_restored_tracker_continues_where_it_was():
    third = WordleWeights(repeat=2.0)
    curriculum = Curriculum(phases=(FORMAT_PHASE, STRATEGY_PHASE, third), threshold=0.9, window=4)
    tracker = CurriculumTracker(curriculum)
    for share in (1.0,) * 7:  # phase 1 after four episodes, then three of the next window
        tracker.record(share)
    restored = CurriculumTracker(curriculum)
    restored.load_state_dict(tracker.state_dict())
    assert restored.phase == 1 and restored.weights == STRATEGY_PHASE
    restored.record(1.0)  # the fourth of the window it took over: the next phase starts
    assert restored.phase == 2 and restored.weights == third
    assert restored.state_dict() == {"phase": 2, "recent": []}


def test_builder_games_take_the_curriculum_weights(smollm2_tokenizer):
    tracker = CurriculumTracker(Curriculum(window=1))
    builder = WordleBuilder(smollm2_tokenizer, WordleRules(), tracker)
    results = play(builder({"answer": "above"}), smollm2_tokenizer, [strict("above")])
    # A finished game does not move the curriculum: the trainer does, from every process's episodes.
    assert results[-1].metrics["curriculum_phase"] == 0.0 and tracker.phase == 0
    tracker.record(results[-1].metrics["format_rate"])
    assert tracker.phase == 1
    results = play(builder({"answer": "above"}), smollm2_tokenizer, [strict("above")])
    assert results[-1].metrics["reward/format"] == pytest.approx(STRATEGY_PHASE.format)


def test_builder_rejects_a_word_that_is_not_an_answer(smollm2_tokenizer):
    from emoji_rl.errors import UserError

    with pytest.raises(UserError, match="`answer` must be one of the 2315 answers"):
        WordleBuilder(smollm2_tokenizer, WordleRules())({"answer": "xyzzy"})
