import json
import logging

import pytest

from emoji_rl.data import teacher as stage
from emoji_rl.data.claude_batch import ClaudeBatchTeacher
from emoji_rl.data.prompts import Prompt, read_prompts
from emoji_rl.data.teacher import Config, check_answer, reason_kind
from emoji_rl.data.teachers import FEW_SHOT, Answer, OpenAITeacher, Request
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.sender_prompts import SENDER_FIRST_TURN, sender_messages
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import AppendLog, read_jsonl

N = 20
BAD = "message 5 is about a pizza party on the beach"  # the fake teachers answer this one in words


@pytest.fixture
def prompts(tmp_path) -> list[Prompt]:
    made = [
        Prompt(f"p-{i:02d}", f"message {i} is about a pizza party on the beach", "statement", "corpus")
        for i in range(N)
    ]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p.to_record()) + "\n" for p in made))
    return read_prompts(tmp_path / "prompts.jsonl")


def config(tmp_path, **kw) -> Config:
    return Config(prompts=str(tmp_path / "prompts.jsonl"), output_dir=str(tmp_path), poll_interval=0.0, **kw)


def target_of(messages: list[dict]) -> str:
    return messages[-1]["content"].removeprefix(SENDER_FIRST_TURN.format(target=""))


def emoji_for(target: str) -> str:
    return "pizza 🍕" if target == BAD else " 🍕🎉 🏖️\n"  # surrounding whitespace is stripped


class ScriptedTeacher:
    """A teacher with no model: answers from `emoji_for`, and records what it was asked."""

    name = "scripted"

    def __init__(self) -> None:
        self.asked: list[Request] = []

    def run(self, requests):
        self.asked += requests
        for r in requests:
            yield Answer(r.id, r.attempt, emoji_for(r.target))


def ids_in(path) -> list[str]:
    return [r["id"] for r in read_jsonl(path, allow_empty=True)]


# ---------------------------------------------------------------- validation and outputs


def test_few_shot_answers_are_valid_messages():
    for _, emoji in FEW_SHOT:
        assert parse_message(emoji).ok, emoji


def test_answers_are_stripped_and_made_canonical():
    assert check_answer(" 🍕🎬\n", 2, 8) == ("🍕 🎬", None)
    assert check_answer("🍕", 2, 8) == (None, "too few emoji: 1 < 2")
    assert check_answer(None, 2, 8) == (None, "no answer")


def test_reason_kinds_drop_the_particulars():
    assert reason_kind("too few emoji: 1 < 2") == "too few emoji"
    assert reason_kind("non-emoji character 'a' (U+0061) at position 0") == "non-emoji character"
    assert reason_kind("two spaces in a row at position 3") == "two spaces in a row"


def test_stage_writes_chat_records_split_rejects_and_stats(tmp_path, prompts):
    teacher = ScriptedTeacher()
    stats = stage.run(config(tmp_path), teacher, prompts)
    train, test = read_jsonl(tmp_path / "sft_train.jsonl"), read_jsonl(tmp_path / "sft_test.jsonl")
    assert (len(train), len(test)) == (17, 2)  # 19 answered, 10% of them held out
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    record = train[0]
    assert record["messages"] == [
        *sender_messages(record["target"]),
        {"role": "assistant", "content": "🍕 🎉 🏖️"},
    ]
    # The prompt answered in words was asked max_attempts times, then dropped.
    assert [r.attempt for r in teacher.asked if r.target == BAD] == [1, 2, 3]
    rejects = read_jsonl(tmp_path / "sft_rejects.jsonl")
    assert [(r["id"], r["attempt"], r["kind"]) for r in rejects] == [
        ("p-05", a, "non-emoji character") for a in (1, 2, 3)
    ]
    assert stats["unanswered"] == 1 and stats["rejects_by_reason"] == {"non-emoji character": 3}
    assert stats["emoji_per_message"] == {"3": 19} and stats["distinct_emoji"] == 3
    assert stats["top20"] == {"🍕": 19, "🎉": 19, "🏖️": 19}
    assert json.loads((tmp_path / "sft_stats.json").read_text()) == stats


def test_split_is_seeded(tmp_path, prompts):
    stage.run(config(tmp_path), ScriptedTeacher(), prompts)
    first = ids_in(tmp_path / "sft_test.jsonl")
    (tmp_path / "teacher_answers.jsonl").unlink()
    stage.run(config(tmp_path), ScriptedTeacher(), prompts)
    assert ids_in(tmp_path / "sft_test.jsonl") == first
    stage.run(config(tmp_path, seed=1), ScriptedTeacher(), prompts)
    assert ids_in(tmp_path / "sft_test.jsonl") != first


def test_rerun_resumes_from_the_answers_log(tmp_path, prompts):
    stage.run(config(tmp_path), ScriptedTeacher(), prompts)
    again = ScriptedTeacher()
    stage.run(config(tmp_path), again, prompts)
    assert again.asked == []
    # One more attempt allowed: only the unanswered prompt is asked again.
    stage.run(config(tmp_path, max_attempts=4), again, prompts)
    assert [(r.id, r.attempt) for r in again.asked] == [("p-05", 4)]


def test_changed_prompts_are_caught(tmp_path, prompts):
    stage.run(config(tmp_path), ScriptedTeacher(), prompts)
    changed = [Prompt(p.id, p.text + " tonight", p.category, p.source) for p in prompts]
    with pytest.raises(UserError, match="prompts changed"):
        stage.run(config(tmp_path), ScriptedTeacher(), changed)


def test_missing_prompts_file_says_how_to_make_it(tmp_path):
    with pytest.raises(UserError, match="does not exist: make it with `emoji-rl prompts`"):
        stage.main(config(tmp_path))


# ---------------------------------------------------------------- claude-batch


@pytest.fixture
def batch_api(anthropic_api, no_sleep):
    return anthropic_api(lambda params: emoji_for(target_of(params["messages"])), polls=2)


def batch_teacher(server, tmp_path) -> ClaudeBatchTeacher:
    """A fresh teacher and client, as a new process would build them."""
    return ClaudeBatchTeacher(
        server.client(), "claude-test", tmp_path / stage.BATCH_STATE, 64, 0.0, submit_retries=2
    )


def assert_complete_and_once(server, tmp_path):
    submitted = [cid for batch in server.created for cid in batch]
    assert len(submitted) == len(set(submitted)), "an item was submitted twice"
    answers = read_jsonl(tmp_path / stage.ANSWERS_LOG)
    assert len(answers) == len({(r["id"], r["attempt"]) for r in answers}), "an answer was logged twice"
    assert {f"{r['id']}_{r['attempt']}" for r in answers} == set(submitted), "a result was lost"
    answered = ids_in(tmp_path / "sft_train.jsonl") + ids_in(tmp_path / "sft_test.jsonl")
    assert sorted(answered) == [f"p-{i:02d}" for i in range(N) if i != 5]


def test_batch_success(tmp_path, prompts, batch_api):
    stats = stage.run(config(tmp_path), batch_teacher(batch_api, tmp_path), prompts)
    # Batch 1: all 20; batches 2 and 3: the prompt answered in words, attempts 2 and 3.
    assert batch_api.created[0] == [f"p-{i:02d}_1" for i in range(N)]
    assert batch_api.created[1:] == [["p-05_2"], ["p-05_3"]]
    assert stats["answered"] == N - 1
    assert_complete_and_once(batch_api, tmp_path)
    state = json.loads((tmp_path / stage.BATCH_STATE).read_text())
    assert state["pending"] is None and all(b["collected"] for b in state["batches"])


def test_batch_errored_items_go_to_a_new_batch(tmp_path, prompts, batch_api):
    batch_api.errored = {"p-03_1", "p-11_1"}
    stats = stage.run(config(tmp_path), batch_teacher(batch_api, tmp_path), prompts)
    assert batch_api.created[1] == ["p-03_2", "p-05_2", "p-11_2"]
    assert stats["rejects_by_reason"]["api error: overloaded_error"] == 2
    assert_complete_and_once(batch_api, tmp_path)


def test_crash_mid_poll_then_restart_resumes_the_same_batch(tmp_path, prompts, batch_api):
    batch_api.crash_once("GET", "/v1/messages/batches/msgbatch_001")
    with pytest.raises(batch_api.Crash):
        stage.run(config(tmp_path), batch_teacher(batch_api, tmp_path), prompts)
    saved = json.loads((tmp_path / stage.BATCH_STATE).read_text())
    assert [b["id"] for b in saved["batches"]] == ["msgbatch_001"]  # persisted before polling
    stage.run(config(tmp_path), batch_teacher(batch_api, tmp_path), prompts)
    assert len(batch_api.created[0]) == N
    assert_complete_and_once(batch_api, tmp_path)


def test_crash_between_create_and_saving_the_id_adopts_the_batch(tmp_path, prompts, batch_api):
    batch_api.crash_once("POST", "/v1/messages/batches")  # the batch is made, the response is lost
    with pytest.raises(batch_api.Crash):
        stage.run(config(tmp_path), batch_teacher(batch_api, tmp_path), prompts)
    assert json.loads((tmp_path / stage.BATCH_STATE).read_text())["batches"] == []
    stage.run(config(tmp_path), batch_teacher(batch_api, tmp_path), prompts)
    assert batch_api.created[0] == [f"p-{i:02d}_1" for i in range(N)]
    assert all(len(b) == 1 for b in batch_api.created[1:])  # only p-05's retries came after
    assert_complete_and_once(batch_api, tmp_path)


def test_crash_while_saving_results_loses_none(tmp_path, prompts, batch_api, monkeypatch):
    real_append = AppendLog.append

    def append_then_crash(self, record):
        if len(self.records) == 7:
            raise batch_api.Crash("killed while appending")
        real_append(self, record)

    monkeypatch.setattr(AppendLog, "append", append_then_crash)
    with pytest.raises(batch_api.Crash):
        stage.run(config(tmp_path), batch_teacher(batch_api, tmp_path), prompts)
    monkeypatch.setattr(AppendLog, "append", real_append)
    stage.run(config(tmp_path), batch_teacher(batch_api, tmp_path), prompts)
    assert len(batch_api.created[0]) == N
    assert_complete_and_once(batch_api, tmp_path)


def test_rate_limited_create_is_checked_then_retried(tmp_path, prompts, batch_api):
    batch_api.statuses = [429]
    stage.run(config(tmp_path), batch_teacher(batch_api, tmp_path), prompts)
    assert ("GET", "/v1/messages/batches") in batch_api.calls  # looked for a batch before resubmitting
    assert batch_api.created[0] == [f"p-{i:02d}_1" for i in range(N)]
    assert_complete_and_once(batch_api, tmp_path)


def test_batch_teacher_needs_the_key_before_any_work(tmp_path, prompts, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(UserError) as err:
        stage.main(config(tmp_path, teacher="claude-batch"))
    assert "ANTHROPIC_API_KEY" in str(err.value) and "--teacher offline" in str(err.value)
    assert sorted(tmp_path.iterdir()) == before


def test_the_key_never_reaches_state_outputs_or_logs(tmp_path, prompts, batch_api, caplog):
    caplog.set_level(logging.DEBUG)
    batch_api.statuses = [429]
    stage.run(config(tmp_path), batch_teacher(batch_api, tmp_path), prompts)
    assert batch_api.api_key not in caplog.text
    for path in tmp_path.iterdir():
        assert batch_api.api_key not in path.read_text(), path


# ---------------------------------------------------------------- openai-compatible


def test_openai_teacher_sends_the_grammar_as_top_level_structured_outputs(tmp_path, prompts, openai_api):
    from emoji_rl.emoji.constraint import vllm_structured_outputs

    server = openai_api(lambda body: emoji_for(target_of(body["messages"])))
    teacher = OpenAITeacher(server.client(), "qwen-test", 2, 8, max_tokens=64, temperature=0.7, concurrency=4)
    stats = stage.run(config(tmp_path, teacher="openai", model="qwen-test"), teacher, prompts)
    assert stats["answered"] == N - 1 and len(server.bodies) == N + 2
    body = server.bodies[0]
    assert body["structured_outputs"] == vllm_structured_outputs(2, 8)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "extra_body" not in body and body["model"] == "qwen-test" and body["max_completion_tokens"] == 64
    assert body["messages"][0]["role"] == "system" and len(body["messages"]) == 2 + 2 * len(FEW_SHOT)


def test_a_vocabulary_is_for_the_offline_teacher_only():
    with pytest.raises(ValueError, match="only with --teacher offline"):
        Config(teacher="claude-batch", vocabulary_min_count=20)
    with pytest.raises(ValueError, match="vocabulary_min_count=-1"):
        Config(vocabulary_min_count=-1)


def test_openai_teacher_needs_a_model_name():
    with pytest.raises(ValueError, match="--teacher openai needs --model"):
        Config(teacher="openai")


# ---------------------------------------------------------------- offline


@pytest.mark.slow
def test_offline_teacher_answers_every_prompt(tmp_path, prompts, embedder):
    from emoji_rl.data.teachers import OfflineTeacherAdapter

    stats = stage.run(config(tmp_path), OfflineTeacherAdapter(embedder, 2, 8), prompts[:8])
    assert stats["answered"] == 8 and stats["rejected"] == 0


def test_a_vocabulary_too_small_for_an_answer_is_a_user_error(prompts, embedder):
    from emoji_rl.data.teachers import OfflineTeacherAdapter

    with pytest.raises(UserError, match="--vocabulary_min_count over 8 prompts: min_count=50 keeps 0 emoji"):
        OfflineTeacherAdapter(embedder, 2, 8, 50, [p.text for p in prompts[:8]])


def test_a_dead_server_stops_the_stage_naming_its_url_and_a_rerun_asks_again(tmp_path, prompts, openai_api):
    import openai

    dead = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="EMPTY", max_retries=0)
    cfg = config(tmp_path, teacher="openai", model="qwen-test", concurrency=2)
    teacher = OpenAITeacher(dead, "qwen-test", 2, 8, max_tokens=64, temperature=0.7, concurrency=2)
    with pytest.raises(
        UserError, match=r"cannot reach the OpenAI-compatible server at http://127\.0\.0\.1:9/v1"
    ):
        stage.run(cfg, teacher, prompts)
    assert ids_in(tmp_path / stage.ANSWERS_LOG) == []  # a connection failure is no answer
    server = openai_api(lambda body: emoji_for(target_of(body["messages"])))
    working = OpenAITeacher(server.client(), "qwen-test", 2, 8, max_tokens=64, temperature=0.7, concurrency=2)
    assert stage.run(cfg, working, prompts)["answered"] == N - 1
    assert len(server.bodies) == N + 2  # every prompt asked, the one answered in words three times


def test_a_dead_server_is_named_at_the_first_failure_then_retried_quietly(
    tmp_path, prompts, caplog, monkeypatch
):
    import socket
    import time

    with socket.socket() as probe:  # a port nothing listens on: bound, then closed
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    backoffs: list[float] = []
    monkeypatch.setattr(time, "sleep", backoffs.append)
    cfg = config(tmp_path, teacher="openai", model="qwen-test", base_url=url, max_retries=3, concurrency=4)
    caplog.set_level(logging.INFO)  # as the CLI logs
    with pytest.raises(UserError) as err:
        stage.run(cfg, stage.build_teacher(cfg, prompts), prompts)
    assert str(err.value).startswith(
        f"cannot reach the OpenAI-compatible server at {url}/ (ConnectError: [Errno 111] Connection refused, "
        "after 3 retries): start it"
    ), err.value
    assert len(backoffs) >= 3  # the client did retry: each request 3 times
    lines = [r.getMessage() for r in caplog.records]
    first = next(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert first.startswith(
        f"cannot connect to the OpenAI-compatible server at {url} (POST {url}/chat/completions: "
        "[Errno 111] Connection refused); retrying quietly, up to 3 times per request"
    ), lines
    assert not any("Retrying request" in line for line in lines), lines
    assert sum(url in line for line in lines) == 1, lines


def test_connection_failures_an_earlier_version_logged_spend_no_attempt(tmp_path, prompts):
    with AppendLog(tmp_path / stage.ANSWERS_LOG) as log:
        for p in prompts:
            for attempt in (1, 2, 3):
                log.append(
                    {"id": p.id, "attempt": attempt, "target": p.text, "answer": None,
                     "error": "api error: APIConnectionError", "teacher": "openai"}
                )  # fmt: skip
    teacher = ScriptedTeacher()
    stats = stage.run(config(tmp_path), teacher, prompts)
    assert stats["answered"] == N - 1
    assert {r.attempt for r in teacher.asked if r.target != BAD} == {4}  # numbered after the old records


def test_no_valid_answer_at_all_writes_the_rejects_it_names(tmp_path, prompts):
    class InWords(ScriptedTeacher):
        def run(self, requests):
            yield from (Answer(r.id, r.attempt, "pizza") for r in requests)

    with pytest.raises(
        UserError, match=f"no valid answer for any of {N} prompts; see {tmp_path}/sft_rejects.jsonl"
    ):
        stage.run(config(tmp_path), InWords(), prompts)
    assert len(ids_in(tmp_path / stage.REJECTS_FILE)) == 3 * N
