import json
import logging

import pytest

from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import DataError, UserError
from emoji_rl.lm import template
from emoji_rl.sft.data import (
    ChatRecord,
    Encoded,
    encode_file,
    encode_record,
    fit_to_length,
    load_chat_records,
    to_dataset,
)

from .conftest import PAIRS, write_chats


def _write_lines(path, objects):
    path.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objects), encoding="utf-8")
    return path


def _record(target="Let's grab pizza tonight", answer="🍕 🌙"):
    return {"messages": [*sender_messages(target), {"role": "assistant", "content": answer}]}


def test_record_without_assistant_turn_names_file_and_line(tmp_path):
    path = _write_lines(
        tmp_path / "train.jsonl", [_record(), {"messages": sender_messages("no answer here")}]
    )
    with pytest.raises(DataError) as err:
        load_chat_records(path)
    assert (err.value.path, err.value.line) == (str(path), 2)
    assert "last turn is 'user', not 'assistant'" in str(err.value)


def test_record_ending_on_a_user_turn_after_an_answer_is_rejected(tmp_path):
    record = _record()
    record["messages"].append({"role": "user", "content": "and again?"})
    with pytest.raises(DataError, match=r"train.jsonl:1: the last turn is 'user'"):
        load_chat_records(_write_lines(tmp_path / "train.jsonl", [record]))


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ({"prompt": "x"}, "missing field 'messages'"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "assistant", "content": "🍕 🌙"}]}, "only an assistant turn"),
        ({"messages": [{"role": "bot", "content": "hi"}]}, r"messages\[0\] must be"),
        ({**_record(), "target": 3}, "`target` must be a string"),
    ],
)
def test_malformed_records_are_data_errors(tmp_path, obj, reason):
    with pytest.raises(DataError, match=reason):
        load_chat_records(_write_lines(tmp_path / "bad.jsonl", [obj]))


def test_target_comes_from_the_key_or_the_sender_prompt(tmp_path):
    path = _write_lines(
        tmp_path / "t.jsonl", [{**_record("A", "🍕 🌙"), "target": "B"}, _record("C", "🍕 🌙")]
    )
    assert [r.target for r in load_chat_records(path)] == ["B", "C"]


def test_prompt_plus_completion_is_the_whole_chat_token_for_token(smollm2_tokenizer):
    record = ChatRecord.from_record(_record(answer="🍕 🎬 🌙"))
    encoded = encode_record(smollm2_tokenizer, record)
    prompt_ids = template.chat_ids(smollm2_tokenizer, record.prompt, add_generation_prompt=True)
    assert list(encoded.input_ids) == template.chat_ids(smollm2_tokenizer, list(record.messages), False)
    assert list(encoded.input_ids[: encoded.completion_start]) == prompt_ids
    completion = smollm2_tokenizer.decode(encoded.input_ids[encoded.completion_start :])
    assert completion == "🍕 🎬 🌙<|im_end|>\n"


def test_completion_mask_covers_the_answer_only(smollm2_tokenizer):
    encoded = encode_record(smollm2_tokenizer, ChatRecord.from_record(_record()))
    row = to_dataset([encoded])[0]
    assert row["input_ids"] == list(encoded.input_ids)
    assert row["completion_mask"].index(1) == encoded.completion_start
    assert all(row["completion_mask"][encoded.completion_start :])


def test_fit_to_length_drops_or_truncates_and_counts():
    short, long_answer, long_prompt = Encoded((1,) * 5, 3), Encoded((1,) * 12, 4), Encoded((1,) * 12, 10)
    kept, report = fit_to_length([short, long_answer, long_prompt], 8, "drop")
    assert kept == [short]
    assert (report.overlong, report.truncated, report.dropped, report.longest) == (2, 0, 2, 12)
    kept, report = fit_to_length([short, long_answer, long_prompt], 8, "truncate")
    # a truncated example keeps its prompt and the start of the answer; one with no answer left goes
    assert kept == [short, Encoded((1,) * 8, 4)]
    assert (report.truncated, report.dropped) == (1, 1)


def test_overlong_examples_are_counted_in_a_warning(tmp_path, smollm2_tokenizer, caplog):
    path = write_chats(tmp_path / "train.jsonl", [*PAIRS[:3], (" ".join(["word"] * 80), "📝 📝")])
    with caplog.at_level(logging.WARNING, logger="emoji_rl.sft.data"):
        kept = encode_file(smollm2_tokenizer, path, max_length=100, overlong="drop")
    assert len(kept) == 3
    assert "1 of 4 examples are longer than max_length=100 tokens" in caplog.text
    assert "0 truncated, 1 dropped" in caplog.text


def test_all_examples_overlong_is_an_error(tmp_path, smollm2_tokenizer):
    path = write_chats(tmp_path / "train.jsonl", PAIRS[:2])
    with pytest.raises(UserError, match="every example is longer than max_length=20"):
        encode_file(smollm2_tokenizer, path, max_length=20, overlong="truncate")
