"""Judges: names and glosses of known emoji, the chat an LLM judge reads, output cleaning, and the
lexicon judge's signal gap (issue 8)."""

from __future__ import annotations

import asyncio
import importlib
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import emoji as emoji_pkg
from emoji_rl.config import build_parser, parse_config
from emoji_rl.emoji.alphabet import ALPHABET
from emoji_rl.errors import UserError
from emoji_rl.play.guessing import (
    FEW_SHOT,
    JUDGE_FIRST_TURN,
    JUDGE_NEXT_TURN,
    JUDGE_SYSTEM,
    UNKNOWN,
    JudgeInput,
    clean_guess,
    judge_messages,
    plain_name,
    render_turn,
)
from emoji_rl.play.judge import HFJudge, LexiconJudge
from emoji_rl.play.judge_config import JudgeConfig, JudgeFields, make_judge
from emoji_rl.play.similarity import Similarity


@pytest.mark.parametrize(
    ("emoji", "name"),
    [
        ("🍕", "pizza"),
        ("👍🏽", "thumbs up"),
        ("🧔🏽‍♂️", "man beard"),
        ("👩🏾‍💻", "woman technologist"),
        ("👨‍👩‍👧", "family man woman girl"),
        ("🧑🏿‍🤝‍🧑🏻", "people holding hands"),
        ("🫱🏼‍🫲🏿", "handshake"),
        ("🏳️‍🌈", "rainbow flag"),
        ("😶‍🌫️", "face in clouds"),
        ("🇯🇵", "Japan"),
    ],
)
def test_plain_name_drops_skin_tones_and_keeps_zwj_meaning(emoji, name):
    assert emoji in ALPHABET
    assert plain_name(emoji) == name


def test_no_plain_name_mentions_skin():
    assert not [e for e in ALPHABET if "skin" in plain_name(e)]


def test_render_turn_views():
    assert render_turn(("🍕", "🎬"), "raw") == "🍕 🎬"
    assert render_turn(("🍕", "👋🏻"), "gloss") == "🍕 (pizza) 👋🏻 (waving hand)"


async def test_lexicon_judge_guesses_the_names_of_all_turns_once_each():
    judge = LexiconJudge()
    first = JudgeInput((("🍕", "🎬"),))
    second = JudgeInput((("🍕", "🎬"), ("👍🏽", "🍕", "👍")), ("pizza, clapper board",))
    guesses = await judge.guess([first, second])
    assert [g.text for g in guesses] == ["pizza, clapper board", "pizza, clapper board, thumbs up"]
    assert not any(g.stripped_emoji for g in guesses)


def test_judge_input_needs_one_guess_per_earlier_turn():
    with pytest.raises(AssertionError):
        JudgeInput((("🍕", "🎬"),), ("a guess",))
    with pytest.raises(AssertionError):
        JudgeInput(())


def test_judge_messages_show_earlier_guesses_as_assistant_turns():
    episode = JudgeInput((("🍕", "🎬"), ("🌃", "🍿")), ("We ate pizza.",))
    messages = judge_messages(episode, "gloss")
    assert messages[0] == {"role": "system", "content": JUDGE_SYSTEM["gloss"]}
    shots = 2 * len(FEW_SHOT)
    assert [m["role"] for m in messages[1 + shots :]] == ["user", "assistant", "user"]
    assert messages[1 + shots]["content"] == JUDGE_FIRST_TURN.format(emoji="🍕 (pizza) 🎬 (clapper board)")
    assert messages[2 + shots]["content"] == "We ate pizza."
    assert messages[3 + shots]["content"] == JUDGE_NEXT_TURN.format(
        emoji="🌃 (night with stars) 🍿 (popcorn)"
    )
    assert "(pizza)" not in judge_messages(episode, "raw")[1 + shots]["content"]


@pytest.mark.parametrize(
    ("answer", "cleaned", "stripped"),
    [
        ('The message is: "Let\'s get pizza tonight."', "Let's get pizza tonight.", False),
        ("Guess: We went to the beach. It was fun.", "We went to the beach.", False),
        ("**Answer:** Let's meet at noon.", "Let's meet at noon.", False),
        ("I think the message is that we should eat.", "we should eat.", False),
        ('The original message was "I miss you"', "I miss you", False),
        ('"Let\'s grab pizza," said my friend.', "Let's grab pizza", False),
        ("Sure! Here is my guess:\nWe are going camping.", "We are going camping.", False),
        ("The message is about pizza.", "The message is about pizza.", False),
        ("Mr. Smith is here. He came early.", "Mr. Smith is here.", False),
        ("   We are   going home  ", "We are going home", False),
        ("I love pizza 🍕 so much", "I love pizza so much", True),
        ("🍕 (pizza) 🎬 (clapper board)", "pizza clapper board", True),
        ("person feeding baby (couple with", "person feeding baby couple with", False),
        ("cook \ufffd", "cook", True),
        ("🍕🍕🍕", UNKNOWN, True),
        ("🧑🏽‍\U0001faef‍🧑🏾 🫯", UNKNOWN, True),
        ("", UNKNOWN, False),
        ('""', UNKNOWN, False),
        ("12:30 ...", UNKNOWN, False),
        (UNKNOWN, UNKNOWN, False),
    ],
)
def test_clean_guess(answer, cleaned, stripped):
    guess = clean_guess(answer)
    assert (guess.text, guess.stripped_emoji, guess.raw) == (cleaned, stripped, answer)


@given(st.text())
def test_clean_guess_leaves_no_emoji_and_never_empty(answer):
    text = clean_guess(answer).text
    assert text.strip() == text and text
    assert emoji_pkg.emoji_count(text) == 0


def test_make_judge_rejects_a_view_the_lexicon_judge_cannot_use():
    with pytest.raises(UserError, match="lexicon"):
        make_judge("lexicon", "raw")


# Every stage that asks a judge, and its default judge kind (eval-sft runs without one unless asked).
JUDGE_STAGES = {
    "grpo": "hf",
    "rl-prompts": "hf",
    "judge-check": "hf",
    "eval-sft": None,
    "eval-retrieval": "hf",
    "play-game": "hf",
}
JUDGE_FLAGS = [
    "--judge",
    "--judge_view",
    "--judge_model",
    "--judge_url",
    "--judge_api_key_env",
    "--server_wait_s",
]


def _stage_config(stage):
    from emoji_rl import cli

    return cli.config_class(importlib.import_module(cli.STAGES[stage][0]), cli.stage_argv(stage, []))


@pytest.mark.parametrize(("stage", "default"), JUDGE_STAGES.items())
def test_every_judge_stage_takes_the_same_judge_flags(stage, default):
    cls = _stage_config(stage)
    assert issubclass(cls, JudgeFields)
    parser = build_parser(cls, f"emoji-rl {stage}", None)
    helps = {a.option_strings[0]: (a.default, a.help) for a in parser._actions if a.option_strings}
    base = {a.option_strings[0]: a.help for a in build_parser(JudgeConfig, "judge", None)._actions}
    for flag in JUDGE_FLAGS:
        assert flag in helps, (stage, flag)
        if flag != "--judge" or default is not None:
            assert helps[flag][1] == base[flag], (stage, flag)  # one help text, written once
    assert helps["--judge"][0] == default
    assert helps["--judge_view"][0] == "gloss" and helps["--judge_url"][0] == "http://127.0.0.1:8001"


@pytest.mark.parametrize("stage", JUDGE_STAGES)
def test_every_judge_stage_rejects_raw_emoji_for_the_lexicon_judge_before_anything_loads(stage):
    argv = ["--judge", "lexicon", "--judge_view", "raw", "--adapter", "runs/sft/adapter"]
    if stage != "eval-sft":
        argv = argv[:4]
    with pytest.raises(UserError, match="judge_view=raw does not apply to judge=lexicon"):
        parse_config(_stage_config(stage), argv, prog=f"emoji-rl {stage}")


def test_judge_config_builds_the_judge_it_describes():
    judge = JudgeConfig(judge="lexicon").build_judge(runtime=None)
    assert isinstance(judge, LexiconJudge)
    assert JudgeConfig(judge="lexicon").judge_reads_names
    assert JudgeConfig(judge="hf", judge_view="gloss").judge_reads_names
    assert not JudgeConfig(judge="openai", judge_view="raw").judge_reads_names


# Hand-picked emoji for eight everyday messages, and seeded random alphabet emoji of the same length.
SIGNAL_SET = [
    ("Let's grab pizza and watch a movie tonight", ("🍕", "🎬", "🌃")),
    ("My cat knocked the birthday cake off the table", ("🐈", "🎂", "💥")),
    ("I'm so excited for our beach trip this weekend", ("🤩", "🏖️", "🚗")),
    ("I failed my driving test again and I feel terrible", ("🚗", "📝", "❌", "😞")),
    ("It is snowing so let's build a snowman", ("❄️", "☃️")),
    ("I spilled coffee all over my laptop", ("☕", "💦", "💻")),
    ("We planted tomatoes in the garden", ("🍅", "🌱", "🏡")),
    ("Happy birthday, let's celebrate with cake", ("🎂", "🎉", "🥳")),
]


def test_lexicon_judge_tells_chosen_emoji_from_random(embedder):
    rng = random.Random(0)
    targets = [m for m, _ in SIGNAL_SET]
    chosen = [JudgeInput((emoji,)) for _, emoji in SIGNAL_SET]
    randoms = [JudgeInput((tuple(rng.sample(ALPHABET, len(emoji))),)) for _, emoji in SIGNAL_SET]
    judge, similarity = LexiconJudge(), Similarity(embedder)
    chosen_guesses = [g.text for g in asyncio.run(judge.guess(chosen))]
    random_guesses = [g.text for g in asyncio.run(judge.guess(randoms))]
    chosen_sim = sum(similarity.similarity(targets, chosen_guesses)) / len(targets)
    random_sim = sum(similarity.similarity(targets, random_guesses)) / len(targets)
    assert chosen_sim - random_sim >= 0.15, (chosen_sim, random_sim)
    assert similarity.retrieval_at_1(targets, chosen_guesses) >= 0.75
    assert similarity.retrieval_at_1(targets, random_guesses) <= 0.25


@pytest.mark.slow
async def test_hf_judge_writes_plain_sentences(smollm2_model, smollm2_tokenizer):
    import torch

    torch.manual_seed(0)
    judge = HFJudge(smollm2_model, smollm2_tokenizer, "gloss", name="smollm2", batch_size=4)
    episodes = [
        JudgeInput((("🍕", "🎬", "🌃"),)),
        JudgeInput((("🏖️", "☀️"),)),
        JudgeInput((("🐈", "🎂"), ("💥", "😱")), ("My cat likes birthday cake.",)),
    ]
    guesses = await judge.guess(episodes)
    assert len(guesses) == 3
    for guess in guesses:
        assert guess.text != UNKNOWN and len(guess.text.split()) <= 40, guess
        assert not any(ord(ch) >= 0x1F000 for ch in guess.text), guess


@pytest.mark.slow
async def test_a_greedy_hf_judge_decodes_each_distinct_input_once(smollm2_model, smollm2_tokenizer):
    pizza, beach, cat = (JudgeInput((turn,)) for turn in [("🍕", "🎬"), ("🏖️", "☀️"), ("🐈", "🎂")])

    def counting(judge):
        decoded, generate = [], judge.completer._generate
        judge.completer._generate = lambda prompts: decoded.append(len(prompts)) or generate(prompts)
        return judge, decoded

    judge, decoded = counting(HFJudge(smollm2_model, smollm2_tokenizer, "gloss", "smollm2", temperature=0.0))
    first = await judge.guess([pizza, beach, pizza])
    second = await judge.guess([beach, cat])
    assert decoded == [2, 1]  # pizza and beach, then cat alone
    assert first[2] == first[0] and second[0] == first[1]
    fresh = HFJudge(smollm2_model, smollm2_tokenizer, "gloss", "smollm2", temperature=0.0)
    assert await fresh.guess([pizza, beach]) == first[:2]  # what decoding them gives

    sampling, decoded = counting(
        HFJudge(smollm2_model, smollm2_tokenizer, "gloss", "smollm2", temperature=0.3)
    )
    await sampling.guess([pizza, pizza])
    await sampling.guess([pizza])
    assert decoded == [2, 1]  # a sampling judge draws again each time
