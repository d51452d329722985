"""SFT on Wordle traces trains each reply on the ids the game shows the policy in RL, with Qwen3.5's
real chat template (tests/fixtures/qwen3_5_chat_template.jinja), which drops the reasoning of earlier
assistant turns and rewrites the last one's."""

import asyncio
import copy
import json
from pathlib import Path

import pytest

from emoji_rl.errors import DataError
from emoji_rl.games.wordle.data import trace_records
from emoji_rl.games.wordle.game import WordleBuilder, WordleRules
from emoji_rl.games.wordle.rules import load_word_lists
from emoji_rl.games.wordle.solver import EntropySolver
from emoji_rl.lm import template
from emoji_rl.sft.data import ChatRecord, encode_record, load_chat_records

TEMPLATE = Path(__file__).parents[1] / "fixtures" / "qwen3_5_chat_template.jinja"


@pytest.fixture(scope="module")
def qwen3_5_tokenizer(smollm2_tokenizer):
    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.chat_template = TEMPLATE.read_text(encoding="utf-8")
    return tokenizer


@pytest.fixture(scope="module")
def traces():
    """The solver's records of one four-guess game, one per turn."""
    records = trace_records("above", EntropySolver(load_word_lists()).play("above"), 6)
    assert len(records) >= 3
    return records


def rl_ids(tokenizer, record) -> tuple[list[int], int]:
    """The ids the game builds when the policy plays the record's replies, and where the last reply starts."""
    game = WordleBuilder(tokenizer, WordleRules())({"answer": record["answer"]})
    ids = list(asyncio.run(game.start()))
    replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    stop = template.stop_token_id(tokenizer)
    for reply in replies[:-1]:
        action = (*tokenizer(reply, add_special_tokens=False)["input_ids"], stop)
        ids += [*action, *asyncio.run(game.step(action)).next_observation_ids]
    return [*ids, *tokenizer(replies[-1], add_special_tokens=False)["input_ids"], stop], len(ids)


def test_the_real_template_drops_earlier_reasoning(qwen3_5_tokenizer, traces):
    messages = traces[-1]["messages"]
    text = template.chat_text(qwen3_5_tokenizer, messages, add_generation_prompt=False)
    earlier = [m["content"] for m in messages[:-1] if m["role"] == "assistant"]
    thoughts = [reply.split("</think>")[0].removeprefix("<think>") for reply in earlier]
    assert all(t not in text for t in thoughts)
    assert all(reply.split("</think>")[1] in text for reply in earlier)
    # ...and the whole chat does not extend the prompt: the generation prompt is an empty think block.
    prompt = template.chat_text(qwen3_5_tokenizer, messages[:-1], add_generation_prompt=True)
    assert prompt.endswith("<think>\n\n</think>\n\n") and not text.startswith(prompt)


@pytest.mark.parametrize("template", ["qwen3.5", "smollm2"])
def test_each_turn_is_encoded_as_the_game_grows_its_ids(
    template, qwen3_5_tokenizer, smollm2_tokenizer, traces
):
    tokenizer = qwen3_5_tokenizer if template == "qwen3.5" else smollm2_tokenizer
    for record in traces:
        encoded = encode_record(tokenizer, ChatRecord.from_record(record))
        ids, start = rl_ids(tokenizer, record)
        assert list(encoded.input_ids) == ids and encoded.completion_start == start
        completion = tokenizer.decode(encoded.input_ids[encoded.completion_start :])
        assert completion == record["messages"][-1]["content"] + "<|im_end|>"
    # the earlier reasoning stays in the context of the last turn, as the policy wrote it
    context = tokenizer.decode(encoded.input_ids[: encoded.completion_start])
    assert traces[0]["messages"][2]["content"] in context


def test_a_game_turn_must_alternate_replies_and_board_turns(tmp_path, traces):
    record = copy.deepcopy(traces[1])
    del record["messages"][3]  # the board after the first guess
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="alternates assistant and user"):
        load_chat_records(path)
