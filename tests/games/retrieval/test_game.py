"""The retrieval game with a scripted sender and the lexicon judge: no model runs."""

import asyncio

import pytest
from tests.floats import F64
from tests.games.scripted import ScriptedSampler

from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.games.retrieval.game import RetrievalBuilder, RetrievalRules
from emoji_rl.lm import models, template
from emoji_rl.play.judge import LexiconJudge
from emoji_rl.play.loop import play
from emoji_rl.play.reward import RewardWeights, terminal_reward
from emoji_rl.play.similarity import Background, Similarity


@pytest.fixture(scope="module")
def similarity():
    return Similarity(models.load_embedder())


def _builder(tokenizer, similarity, **rules):
    return RetrievalBuilder(tokenizer, LexiconJudge(), similarity, RetrievalRules(**rules))


def test_terminal_reward_hand_worked():
    terms = terminal_reward(
        0.9, turns=2, violation=False, unique_emoji=3, total_emoji=4, tau=0.85, weights=RewardWeights()
    )
    # 0.9 + 0.5 - 0.1*2 - 0 - 0.3*(1 - 3/4)
    assert terms["total"] == pytest.approx(0.9 + 0.5 - 0.2 - 0.075)
    violation = terminal_reward(0.0, 1, True, 0, 0, 0.85, RewardWeights())
    assert violation["total"] == pytest.approx(-0.1 - 0.5)
    # 0.3 - 0.1 - 0.8*0.25: a guess as close to other messages as to its own target earns little
    contrast = terminal_reward(0.3, 1, False, 2, 2, 0.85, RewardWeights(contrast=0.8), background=0.25)
    assert contrast["contrast"] == pytest.approx(-0.2)
    assert contrast["total"] == pytest.approx(0.3 - 0.1 - 0.2)


@pytest.mark.float_paths
def test_the_contrast_term_charges_the_final_guess_background(smollm2_tokenizer, embedder_f64):
    # The game's batch of texts against the test's own: two orders, in float64 (tests/floats.py).
    similarity = Similarity(embedder_f64)
    messages = ["The train is late", "My flight got cancelled", "pizza night"]
    weights = RewardWeights(contrast=1.0)
    builder = RetrievalBuilder(
        smollm2_tokenizer,
        LexiconJudge(),
        similarity,
        RetrievalRules(max_turns=1, tau=0.99, weights=weights),
        Background(similarity, messages),
    )
    [episode] = asyncio.run(
        play([builder({"target": "pizza night"})], ScriptedSampler(smollm2_tokenizer, ["🍕 🎬"]))
    )
    result = episode.turns[0].result
    guess = result.log["guess"]
    [background] = Background(similarity, messages[:2]).score(["pizza night"], [guess])
    expected = terminal_reward(result.metrics["similarity"], 1, False, 2, 2, 0.99, weights, background)
    assert result.metrics["reward/contrast"] == pytest.approx(-background, abs=F64["atol"])
    assert result.reward == pytest.approx(expected["total"], abs=F64["atol"])


def test_episode_runs_max_turns_and_grows_as_token_ids(smollm2_tokenizer, similarity):
    builder = _builder(smollm2_tokenizer, similarity, max_turns=3, tau=0.99)
    sampler = ScriptedSampler(smollm2_tokenizer, ["🍕 🎬", "🍕 🍿", "🎉 🎉"])
    [episode] = asyncio.run(play([builder({"target": "Let's get pizza and watch a movie tonight"})], sampler))
    assert len(episode.turns) == 3
    # Each turn's prompt is the previous prompt + action + observation, never re-tokenized.
    first, second, third = (p[0] for p in sampler.prompts)
    assert first == tuple(
        template.chat_ids(smollm2_tokenizer, sender_messages("Let's get pizza and watch a movie tonight"))
    )
    assert second[: len(first)] == first
    assert second[len(first) : len(first) + len(episode.turns[0].action_ids)] == episode.turns[0].action_ids
    assert third[: len(second)] == second
    observation = smollm2_tokenizer.decode(episode.turns[1].observation_ids)
    assert observation.startswith('\n<|im_start|>user\nThe receiver guessed: "pizza, clapper board"')
    assert observation.endswith("<|im_start|>assistant\n")
    assert episode.token_ids() == (*third, *episode.turns[2].action_ids)
    # The lexicon judge's final guess names every emoji sent; the reward is terminal only.
    final = episode.turns[-1].result
    assert [t.result.reward for t in episode.turns[:-1]] == [0.0, 0.0]
    assert final.log["guess"] == "pizza, clapper board, popcorn, party popper"
    unique, total = 4, 6
    expected = terminal_reward(final.metrics["similarity"], 3, False, unique, total, 0.99, RewardWeights())
    assert final.reward == pytest.approx(expected["total"])


def test_success_ends_the_game_early(smollm2_tokenizer, similarity):
    builder = _builder(smollm2_tokenizer, similarity, max_turns=5, tau=0.5)
    sampler = ScriptedSampler(smollm2_tokenizer, ["🍕 🍕"])
    [episode] = asyncio.run(play([builder({"target": "pizza"})], sampler))
    assert len(episode.turns) == 1
    assert episode.turns[0].result.metrics["success@0.85"] == 1.0


def test_each_turn_hands_the_sampler_the_live_episodes_last_samples(smollm2_tokenizer, similarity):
    # "pizza" is won on turn 1; the other game goes on, and only its turn-1 sample comes back.
    builder = _builder(smollm2_tokenizer, similarity, max_turns=2, tau=0.5)
    sampler = ScriptedSampler(smollm2_tokenizer, ["🍕 🍕", "🎉 🎉"])
    asyncio.run(play([builder({"target": "pizza"}), builder({"target": "a quiet evening"})], sampler))
    assert sampler.previous[0] == [None, None]
    (carried,) = sampler.previous[1]
    assert carried is sampler.samples[0][1]


@pytest.mark.parametrize(("text", "end_turn"), [("I like pizza", True), ("🍕 🎬", False)])
def test_invalid_turn_ends_with_format_penalty(smollm2_tokenizer, similarity, text, end_turn):
    builder = _builder(smollm2_tokenizer, similarity)
    sampler = ScriptedSampler(smollm2_tokenizer, [text], end_turn=end_turn)
    [episode] = asyncio.run(play([builder({"target": "pizza night"})], sampler))
    result = episode.turns[0].result
    assert result.done and result.metrics["format_violation"] == 1.0
    assert result.reward == pytest.approx(-0.1 - 0.5)


def test_games_of_one_turn_share_one_judge_and_one_embedding_call(smollm2_tokenizer, similarity):
    builder = _builder(smollm2_tokenizer, similarity, max_turns=2, tau=0.99)
    sampler = ScriptedSampler(smollm2_tokenizer, ["🍕 🎬", "🎉 🎉"])
    games = [builder({"target": f"message {i}"}) for i in range(6)]
    asyncio.run(play(games, sampler))
    assert builder._ask_judge.batch_sizes == [6, 6]
    assert builder._score.batch_sizes == [6, 6]
