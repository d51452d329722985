"""play-web over HTTP on 127.0.0.1, with stand-in models (tests/web/conftest.py): the behaviour under
test is the web layer's (what is stored, what is refused, what the page can see), not the models'."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from emoji_rl.cli import STAGES
from emoji_rl.web.app import Config
from emoji_rl.web.rounds import MAX_TEXT_CHARS
from emoji_rl.web.runners import LoadedModels, Stopped
from emoji_rl.web.server import STATIC, is_loopback


def test_a_guess_round_stores_one_full_row(served, senders):
    client, game, _ = served
    shown = client.guess_round()
    assert shown["emoji"] == "🍕 🎬" and shown["turn"] == 1
    assert "sender" not in shown and "target" not in shown  # blind, and the message stays hidden
    answer = client.post(
        "/api/guess/answer", {"round_id": shown["round_id"], "turn": 1, "text": "  pizza   tonight "}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["guess"] == "pizza tonight"
    assert body["target"] == dict(game.targets)[game.store.round(shown["round_id"]).target_id]
    assert body["judge_guess"] == "pizza and a movie"
    (row,) = game.store.answers()
    assert (
        row["text"] == "pizza tonight"
        and row["emoji"] == "🍕 🎬"
        and row["judge_guess"] == "pizza and a movie"
    )
    assert row["similarity"] == body["similarity"]
    assert row["adapter"] == senders[row["sender"]]
    assert (row["adapter_hash"] is None) == (row["sender"] == "base")


def test_pages_answer_while_the_sender_writes(served):
    client, _, models = served
    models.hold.clear()
    job = client.post("/api/guess/start", {}).json()["job"]
    start = time.perf_counter()
    assert client.get("/api/job", params={"id": job}).json()["state"] in {"queued", "running"}
    second = client.post("/api/guess/start", {}).json()["job"]
    status = client.get("/api/job", params={"id": second}).json()
    assert status["state"] == "queued" and status["ahead"] == 0
    assert client.get("/api/leaderboard").status_code == 200
    assert client.get("/").status_code == 200
    assert time.perf_counter() - start < 5
    models.hold.set()
    assert client.wait(job)["state"] == "done" and client.wait(second)["state"] == "done"


def test_empty_and_long_guesses_are_refused_and_not_stored(served):
    client, game, _ = served
    shown = client.guess_round()
    for text, message in [("   ", "empty"), ("x" * (MAX_TEXT_CHARS + 1), "too long"), (None, "must be text")]:
        r = client.post("/api/guess/answer", {"round_id": shown["round_id"], "turn": 1, "text": text})
        assert r.status_code == 400 and message in r.json()["error"], r.text
    assert game.store.answers() == []
    ok = client.post(
        "/api/guess/answer", {"round_id": shown["round_id"], "turn": 1, "text": "x" * MAX_TEXT_CHARS}
    )
    assert ok.status_code == 200


def test_double_submit_is_a_clear_error_and_one_row(served):
    client, game, _ = served
    shown = client.guess_round()
    body = {"round_id": shown["round_id"], "turn": 1, "text": "pizza"}
    assert client.post("/api/guess/answer", body).status_code == 200
    again = client.post("/api/guess/answer", {**body, "text": "pasta"})
    assert again.status_code == 409 and "answered already" in again.json()["error"]
    assert [a["text"] for a in game.store.answers()] == ["pizza"]


def test_stale_pages_are_refused(served):
    client, game, _ = served
    gone = client.post("/api/guess/answer", {"round_id": "f" * 32, "turn": 1, "text": "pizza"})
    assert gone.status_code == 409 and "out of date" in gone.json()["error"]
    shown = client.guess_round()
    ahead = client.post("/api/guess/answer", {"round_id": shown["round_id"], "turn": 2, "text": "pizza"})
    assert ahead.status_code == 409 and "round is at turn 1" in ahead.json()["error"]
    bad_turn = client.post("/api/guess/answer", {"round_id": shown["round_id"], "turn": "1", "text": "pizza"})
    assert bad_turn.status_code == 400
    assert game.store.answers() == []


def test_another_turn_shows_the_sender_the_persons_guess(served):
    client, game, models = served
    shown = client.guess_round()
    first = client.post(
        "/api/guess/answer", {"round_id": shown["round_id"], "turn": 1, "text": "a cat"}
    ).json()
    assert first["can_continue"]
    # Two requests for "another turn" while the sender writes make one turn; one after it was
    # written (a retry, a click the page let through) gets that same turn back, written once.
    models.hold.clear()
    body = {"round_id": shown["round_id"], "turn": 1}
    (job,) = {client.post("/api/guess/next", body).json()["job"] for _ in range(2)}
    models.hold.set()
    second = client.wait(job)["result"]
    assert second["turn"] == 2 and second["round_id"] == shown["round_id"]
    writes = len(models.conversations)
    repeat = client.post("/api/guess/next", body)
    assert repeat.status_code == 202 and repeat.json()["job"] != job
    assert client.get("/api/job", params={"id": repeat.json()["job"]}).json()["result"] == second
    assert len(models.conversations) == writes and len(game.store.turns(shown["round_id"])) == 2
    _, conversation = models.conversations[-1]
    assert conversation[-1]["role"] == "user" and '"a cat"' in conversation[-1]["content"]
    assert conversation[-2] == {"role": "assistant", "content": "🍕 🎬"}
    # The model judge plays its own game on the same emoji: both turns, its own earlier guess.
    assert models.judged[-1].turns == (("🍕", "🎬"), ("🍕", "🎬"))
    assert models.judged[-1].guesses == ("pizza and a movie",)
    last = client.post(
        "/api/guess/answer", {"round_id": shown["round_id"], "turn": 2, "text": "a dog"}
    ).json()
    assert not last["can_continue"]  # max_turns=2
    over = client.post("/api/guess/next", {"round_id": shown["round_id"], "turn": 2})
    assert over.status_code == 409 and "over" in over.json()["error"]
    stale = client.post("/api/guess/next", body)  # turn 2 is answered: asking after turn 1 is stale
    assert stale.status_code == 409 and "out of date" in stale.json()["error"]
    assert [(a["turn"], a["text"]) for a in game.store.answers()] == [(1, "a cat"), (2, "a dog")]


def test_no_next_turn_before_the_guess(served):
    client, _, _ = served
    shown = client.guess_round()
    early = client.post("/api/guess/next", {"round_id": shown["round_id"], "turn": 1})
    assert early.status_code == 409


def test_senders_are_assigned_balanced(served):
    client, game, _ = served
    for _ in range(6):
        client.guess_round()
    assert game.store.rounds_per_sender("guess") == {"base": 3, "sft": 3}
    for sender in ("base", "sft"):  # and each sender's targets are balanced too
        assert sorted(game.store.rounds_per_target("guess", sender).values()) == [1, 1, 1]


def test_send_mode_checks_the_emoji_and_the_judge_guesses(served):
    client, game, models = served
    shown = client.post("/api/send/start", {"player": "bob"}).json()
    target = shown["target"]
    assert target in game.send_targets.values()
    for emoji, message in [
        ("pizza 🍕", "non-emoji character 'p'"),
        ("🍕", "too few emoji"),
        ("🍕  🎬", "two spaces"),
    ]:
        r = client.post("/api/send/answer", {"round_id": shown["round_id"], "emoji": emoji})
        assert r.status_code == 400 and message in r.json()["error"], r.text
    assert game.store.answers() == []
    job = client.post("/api/send/answer", {"round_id": shown["round_id"], "emoji": "🍕 🌙"}).json()["job"]
    result = client.wait(job)["result"]
    assert result["judge_guess"] == "pizza and a movie" and result["target"] == target
    assert models.judged[-1].turns == (("🍕", "🌙"),)
    (row,) = game.store.answers()
    assert (row["mode"], row["player"], row["emoji"]) == ("send", "bob", "🍕 🌙")
    again = client.post("/api/send/answer", {"round_id": shown["round_id"], "emoji": "🍕 🌙"})
    assert again.status_code == 409


def test_leaderboard_puts_people_beside_models(served):
    client, _, _ = served
    shown = client.guess_round()
    client.post("/api/guess/answer", {"round_id": shown["round_id"], "turn": 1, "text": "pizza"})
    sent = client.post("/api/send/start", {"player": "bob"}).json()
    client.wait(
        client.post("/api/send/answer", {"round_id": sent["round_id"], "emoji": "🍕 🌙"}).json()["job"]
    )
    board = client.get("/api/leaderboard").json()
    (model,) = [r for r in board if r["kind"] == "model"]
    assert [(r["kind"], r["name"]) for r in board if r["kind"] == "person"] == [("person", "bob")]
    assert model["name"] in {"base", "sft"}
    assert all(r["rounds"] == 1 for r in board)


def test_bad_requests(served):
    client, game, _ = served
    json_type = {"Content-Type": "application/json"}
    assert client.http.post("/api/guess/start", content=b"{not json", headers=json_type).status_code == 400
    assert client.http.post("/api/guess/start", content=b"[1]", headers=json_type).status_code == 400
    big = client.http.post("/api/guess/answer", content=b"{" + b" " * 20_000 + b"}", headers=json_type)
    assert big.status_code == 413
    assert client.get("/api/nothing").status_code == 404
    assert client.get("/api/job", params={"id": "nope"}).status_code == 400
    long_name = client.post("/api/guess/start", {"player": "n" * 41})
    assert long_name.status_code == 400 and "name" in long_name.json()["error"]
    assert game.store.answers() == []


def test_page_runs_only_its_own_script_and_writes_text_only(served):
    client, _, _ = served
    page = client.get("/")
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    script = (STATIC / "app.js").read_text()
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "document.write" not in script


def test_stage_and_host_checks():
    assert STAGES["play-web"][0] == "emoji_rl.web.app"
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    assert Config(systems=["base", "rl=x"]).host == "127.0.0.1"


def test_a_stop_cuts_the_models_short_at_their_next_forward_pass():
    import torch

    sender, judge_model = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    judge = SimpleNamespace(model=judge_model)  # an hf judge holds its model as `.model`
    loaded = LoadedModels(sender, None, {"base": None}, judge, None, temperature=0.7, max_new_tokens=4)
    x = torch.ones(1, 2)
    assert sender(x).shape == judge_model(x).shape == (1, 2)  # they run until the stop
    loaded.stop()
    for model in (sender, judge_model):
        with pytest.raises(Stopped):
            model(x)


def test_closing_the_game_ends_the_job_in_flight(served):
    client, game, models = served
    models.hold.clear()
    job = client.post("/api/guess/start", {}).json()["job"]
    queued = client.post("/api/guess/start", {}).json()["job"]
    start = time.perf_counter()
    game.close()  # models.stop releases the held sender; the queued job is dropped
    assert time.perf_counter() - start < 5
    assert game.jobs.status(job)["state"] == "done"
    assert game.jobs.status(queued)["state"] == "queued"
