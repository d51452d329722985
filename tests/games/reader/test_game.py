"""The reader game with a scripted reader and a scripted sender: no language model runs (MiniLM scores)."""

import asyncio

import pytest
from tests.floats import F64
from tests.games.scripted import ScriptedSampler, ScriptedSender

from emoji_rl.emoji.sender_prompts import correction_message, sender_messages
from emoji_rl.errors import UserError
from emoji_rl.games.reader.game import ReaderBuilder, ReaderRules
from emoji_rl.games.reader.partner import Partner, PartnerConfig, PartnerInput, partner_messages
from emoji_rl.lm import models, template
from emoji_rl.play.completer import Completion
from emoji_rl.play.guessing import JudgeInput, judge_messages
from emoji_rl.play.loop import play
from emoji_rl.play.similarity import GuessScorer, Similarity

TARGET = "Let's get pizza and watch a movie tonight"
RECORD = {"id": "m0", "target": TARGET, "emoji": "🍕 🎬"}


@pytest.fixture(scope="module")
def similarity(embedder_f64):
    """In float64: the rewards are compared with the test's own similarity call, batched otherwise
    (tests/floats.py)."""
    return Similarity(embedder_f64)


def _play(tokenizer, similarity, records, reader, sender, **rules):
    builder = ReaderBuilder(tokenizer, Partner(sender), GuessScorer(similarity), ReaderRules(**rules))
    return builder, asyncio.run(play([builder(r) for r in records], reader))


@pytest.mark.float_paths
def test_the_reader_sits_in_the_judges_seat_and_the_sender_sees_each_guess(smollm2_tokenizer, similarity):
    guesses = ["We ate pizza.", "We watched a movie at night.", "Pizza and a movie tonight!"]
    reader = ScriptedSampler(smollm2_tokenizer, guesses)
    sender = ScriptedSender(["🍿 🌃", "🍕 🍿"])
    _, [episode] = _play(smollm2_tokenizer, similarity, [RECORD], reader, sender, max_turns=3, tau=0.99)
    turns = (("🍕", "🎬"), ("🍿", "🌃"), ("🍕", "🍿"))
    # Each turn's context is exactly the judge's chat with the reader's guesses as the judge's own turns:
    # an adapter trained here answers the retrieval game's judge prompt unchanged.
    for t, prompts in enumerate(reader.prompts):
        chat = judge_messages(JudgeInput(turns[: t + 1], tuple(guesses[:t])), "gloss")
        assert prompts[0] == tuple(template.chat_ids(smollm2_tokenizer, chat))
    assert episode.token_ids() == (*reader.prompts[2][0], *episode.turns[2].action_ids)
    # The sender sees what the retrieval game's sender sees after a wrong guess, its own emoji as its turns.
    first, second = (call[0] for call in sender.calls)
    assert first == [
        *sender_messages(TARGET),
        {"role": "assistant", "content": "🍕 🎬"},
        correction_message("We ate pizza.", TARGET),
    ]
    assert second == [
        *first,
        {"role": "assistant", "content": "🍿 🌃"},
        correction_message("We watched a movie at night.", TARGET),
    ]
    # Terminal reward: the final guess's similarity (no contrast here); the first guess is logged.
    [final, first_sim] = similarity.similarity(
        [TARGET, TARGET], ["Pizza and a movie tonight!", "We ate pizza."]
    )
    result = episode.turns[-1].result
    assert [t.result.reward for t in episode.turns[:-1]] == [0.0, 0.0]
    assert result.reward == pytest.approx(final, abs=F64["atol"])
    assert result.metrics["first_similarity"] == pytest.approx(first_sim, abs=F64["atol"])
    assert result.metrics["turns"] == 3.0 and result.metrics["partner_failed"] == 0.0
    assert [t.result.log["emoji"] for t in episode.turns] == ["🍕 🎬", "🍿 🌃", "🍕 🍿"]


def test_a_guess_at_tau_ends_the_game_without_the_sender(smollm2_tokenizer, similarity):
    sender = ScriptedSender([])
    reader = ScriptedSampler(smollm2_tokenizer, [TARGET])
    _, [episode] = _play(smollm2_tokenizer, similarity, [RECORD], reader, sender, max_turns=3, tau=0.9)
    assert len(episode.turns) == 1 and sender.calls == []
    assert episode.reward == pytest.approx(1.0, abs=1e-4)


@pytest.mark.float_paths
def test_a_sender_answer_that_is_no_emoji_message_ends_the_game_on_the_last_guess(
    smollm2_tokenizer, similarity
):
    reader = ScriptedSampler(smollm2_tokenizer, ["We ate pizza.", "never asked"])
    sender = ScriptedSender(["pizza 🍕"])
    _, [episode] = _play(smollm2_tokenizer, similarity, [RECORD], reader, sender, max_turns=3, tau=0.99)
    [expected] = similarity.similarity([TARGET], ["We ate pizza."])
    assert len(episode.turns) == 1 and len(reader.prompts) == 1
    assert episode.turns[0].result.metrics["partner_failed"] == 1.0
    assert episode.reward == pytest.approx(expected, abs=F64["atol"])


def test_a_turn_cut_off_by_the_budget_still_guesses_and_is_closed(smollm2_tokenizer, similarity):
    reader = ScriptedSampler(
        smollm2_tokenizer, ["The message is: we ate pizza", "pizza tonight"], end_turn=False
    )
    sender = ScriptedSender(["🍿 🌃"])
    _, [episode] = _play(smollm2_tokenizer, similarity, [RECORD], reader, sender, max_turns=2, tau=0.99)
    first, second = episode.turns
    assert first.result.log["guess"] == "we ate pizza"  # cleaned as the judge's answers are
    # The cut-off turn gets its end of turn before the next user turn, as the template writes it.
    assert first.result.next_observation_ids[0] == template.stop_token_id(smollm2_tokenizer)
    assert second.result.metrics["cut_off"] == 1.0


def test_concurrent_games_share_one_sender_call_and_one_embedding_call_per_turn(
    smollm2_tokenizer, similarity
):
    reader = ScriptedSampler(smollm2_tokenizer, ["We ate pizza.", "A movie."])
    sender = ScriptedSender(["🍿 🌃"])
    records = [{**RECORD, "target": f"{TARGET} {i}"} for i in range(5)]
    builder, episodes = _play(smollm2_tokenizer, similarity, records, reader, sender, max_turns=2, tau=0.99)
    assert all(len(e.turns) == 2 for e in episodes)
    assert [len(call) for call in sender.calls] == [5]
    assert builder.score.batch_sizes == [5, 5]
    assert {"partner", "similarity"} == builder.seconds.keys()


def test_the_partner_reads_its_answer_as_an_emoji_message_and_needs_the_grammar():
    sender = ScriptedSender([" 🍿 🌃 ", "🍿🌃 words"])
    partner = Partner(sender)
    episode = PartnerInput(TARGET, (("🍕", "🎬"),), ("We ate pizza",))
    assert asyncio.run(partner.add([episode])) == [("🍿", "🌃")]
    assert asyncio.run(partner.add([episode])) == [None]
    assert partner_messages(episode) == sender.calls[0][0]
    free_text = ScriptedSender([])
    free_text.settings = Completion(0.0, 16)
    with pytest.raises(ValueError, match="emoji=True"):
        Partner(free_text)
    with pytest.raises(UserError, match="partner_adapter"):
        PartnerConfig(partner="openai", partner_adapter="runs/sft/adapter")


def build_in_process(config: PartnerConfig):
    """The partner `config` builds in this process on the CPU (no server: url and served name empty)."""
    return config.build_partner(
        models.pick_runtime("cpu"),
        model=models.SMOLLM2,
        url="",
        served_name="",
        min_emoji=2,
        max_emoji=8,
        wait_s=1,
    )


def test_a_missing_adapter_is_named_before_the_sender_loads(tmp_path):
    with pytest.raises(UserError, match=r"adapter_config\.json"):
        build_in_process(PartnerConfig(partner_adapter=str(tmp_path)))


def test_a_partner_model_that_is_no_spec_or_no_model_is_one_line_naming_it(tmp_path):
    """Refused where the config is read when it is no model spec, and where it loads when transformers
    cannot load it (a folder that holds no model, or a config without weights): not a traceback."""
    with pytest.raises(UserError, match=r"^partner_model: model spec 'not a model' is not a hub id"):
        PartnerConfig(partner_model="not a model")
    empty, unweighted = tmp_path / "empty", tmp_path / "unweighted"
    empty.mkdir()
    unweighted.mkdir()
    (unweighted / "config.json").write_text('{"model_type": "llama"}')
    for spec, reason in [
        (empty, "Unrecognized model in"),
        (unweighted, "Error no file named model.safetensors"),
    ]:
        with pytest.raises(
            UserError, match=rf"^partner_model: model {spec}: transformers cannot load it: {reason}"
        ):
            build_in_process(PartnerConfig(partner_model=str(spec)))
