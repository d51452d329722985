import json
import logging

import pytest

from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import DataError, UserError
from emoji_rl.lm import template
from emoji_rl.play.guessing import JudgeInput, judge_messages
from emoji_rl.sft import train
from emoji_rl.sft.data import (
    ChatRecord,
    Encoded,
    encode_file,
    encode_record,
    fit_to_length,
    load_chat_records,
    reader_chats,
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


def test_a_reader_chat_is_the_guessing_chat_of_the_records_emoji_answered_by_its_message(tmp_path):
    records = load_chat_records(write_chats(tmp_path / "train.jsonl", PAIRS[:3]))
    chats = reader_chats(records, share=1.0, view="gloss", seed=0)
    assert [c.target for c in chats] == [t for t, _ in PAIRS[:3]]
    pizza = chats[0]
    assert list(pizza.prompt) == judge_messages(JudgeInput((("🍕", "🎬", "🌙"),)), "gloss")
    assert pizza.prompt[-1]["content"].startswith("Emoji: 🍕 (pizza) 🎬 (clapper board) 🌙 (crescent moon)")
    assert pizza.answer == PAIRS[0][0] and not pizza.episode
    # Shown raw, the reader sees the emoji alone.
    raw = reader_chats(records, share=1.0, view="raw", seed=0)[0]
    assert raw.prompt[-1]["content"].startswith("Emoji: 🍕 🎬 🌙\n")


def test_the_reader_share_is_a_draw_per_record_by_seed_and_nested_as_it_grows(tmp_path):
    records = load_chat_records(write_chats(tmp_path / "train.jsonl", PAIRS))
    assert reader_chats(records, share=0.0, view="gloss", seed=0) == []
    half = {c.target for c in reader_chats(records, share=0.5, view="gloss", seed=0)}
    assert 10 <= len(half) <= 30  # 40 draws at one half
    assert half == {c.target for c in reader_chats(list(reversed(records)), 0.5, "gloss", 0)}
    assert half <= {c.target for c in reader_chats(records, share=0.8, view="gloss", seed=0)}
    assert half != {c.target for c in reader_chats(records, share=0.5, view="gloss", seed=1)}


def test_records_without_a_target_or_an_emoji_message_give_no_reader_chat():
    no_target = ChatRecord(
        ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "🍕 🌙"}), None
    )
    words = ChatRecord.from_record({**_record(answer="pizza tonight"), "target": "pizza tonight"})
    turn = ChatRecord.from_record({**_record(), "turn": 1})
    assert reader_chats([no_target, words, turn], share=1.0, view="gloss", seed=0) == []


def test_training_examples_add_the_reader_chats_and_say_when_none_can_be_made(tmp_path, smollm2_tokenizer):
    path = write_chats(tmp_path / "train.jsonl", PAIRS[:4])
    cfg = train.Config(train_data=str(path), output_dir=str(tmp_path / "run"), max_length=512)
    senders = train.training_examples(cfg, smollm2_tokenizer)
    cfg.reader_share = 1.0
    both = train.training_examples(cfg, smollm2_tokenizer)
    assert both[:4] == senders and len(both) == 8
    answer = smollm2_tokenizer.decode(both[4].input_ids[both[4].completion_start :])
    assert answer == PAIRS[0][0] + "<|im_end|>\n"
    cfg.max_length = 128  # the reader's chat, with its worked examples, is far longer than the sender's
    with pytest.raises(
        UserError, match=r"reader chats, reader_share=1.0\): every example is longer than max_length=128"
    ):
        train.training_examples(cfg, smollm2_tokenizer)
    words = _write_lines(tmp_path / "words.jsonl", [{**_record(answer="pizza tonight"), "target": "pizza"}])
    with pytest.raises(UserError, match=r"reader_share=1.0 made no reader chat from .*words\.jsonl"):
        train.training_examples(train.Config(train_data=str(words), reader_share=1.0), smollm2_tokenizer)


def test_reader_share_outside_0_1_is_an_error():
    with pytest.raises(ValueError, match=r"reader_share=1.5 must be in \[0, 1\]"):
        train.Config(reader_share=1.5)
