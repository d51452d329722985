"""eval-human: the agreement numbers, and the report on answers played over HTTP."""

from __future__ import annotations

import json

import pytest

from emoji_rl.errors import UserError
from emoji_rl.eval.human import ALL_PEOPLE, Config, main, pearson, rounds_by_mode, sender_comparisons
from emoji_rl.web.store import Store


def test_pearson():
    assert pearson([0.1, 0.2, 0.3], [0.2, 0.4, 0.6]) == pytest.approx(1.0)
    assert pearson([0.1, 0.2, 0.3], [0.6, 0.4, 0.2]) == pytest.approx(-1.0)
    assert pearson([0.1, 0.2], [0.2, 0.4]) is None
    assert pearson([0.1, 0.2, 0.3], [0.5, 0.5, 0.5]) is None


def test_rounds_by_mode_takes_first_and_last_turns():
    rows = [
        {"round_id": "a", "turn": 2, "similarity": 0.9},
        {"round_id": "a", "turn": 1, "similarity": 0.3},
        {"round_id": "b", "turn": 1, "similarity": 0.5},
    ]
    modes = rounds_by_mode(rows)
    assert sorted(r["similarity"] for r in modes["single"]) == [0.3, 0.5]
    assert sorted(r["similarity"] for r in modes["multi"]) == [0.5, 0.9]


def test_two_senders_are_compared_target_by_target():
    """The sender trained in both seats beside the one trained alone (issue #61): only targets people
    were shown both senders' emoji for count, each once, its rounds of a sender averaged."""

    def answer(round_id, sender, target, similarity, turn=1):
        return {
            "round_id": round_id,
            "sender": sender,
            "target_id": target,
            "turn": turn,
            "similarity": similarity,
        }

    answers = [
        answer("1", "both", "t1", 0.6),
        answer("2", "both", "t1", 0.4),  # t1: both 0.5 on average
        answer("3", "alone", "t1", 0.3),
        answer("4", "both", "t2", 0.7),
        answer("5", "alone", "t2", 0.6),
        answer("6", "both", "t3", 0.9),  # t3: no round of `alone`, left out
        answer("5", "alone", "t2", 0.8, turn=2),  # round 5's second turn: `multi` only
    ]
    [single, multi] = sender_comparisons(answers, ["both:alone"], 200, 0)
    assert (single["mode"], single["targets"]) == ("single", 2)
    assert single["mean"] == pytest.approx(((0.5 - 0.3) + (0.7 - 0.6)) / 2)
    assert single["low"] <= single["mean"] <= single["high"] and single["verdict"] == "above 0"
    assert multi["mean"] == pytest.approx(((0.5 - 0.3) + (0.7 - 0.8)) / 2)
    assert sender_comparisons(answers, ["both:nobody"], 200, 0)[0]["targets"] == 0
    with pytest.raises(ValueError, match="A:B"):
        Config(compare=["both"])


def play_send(client, player: str) -> None:
    """One send-mode round: `player` writes emoji, the stand-in judge guesses."""
    shown = client.post("/api/send/start", {"player": player}).json()
    job = client.post("/api/send/answer", {"round_id": shown["round_id"], "emoji": "🍕 🎬"}).json()["job"]
    assert client.wait(job)["state"] == "done"


def test_report_on_answers_played_over_http(served, tmp_path, capsys):
    client, game, _ = served
    guesses = ["pizza tonight", "the movie at nine", "bus", "let's grab pizza tonight", "a cat", "nine"]
    for text in guesses:
        shown = client.guess_round()
        assert (
            client.post(
                "/api/guess/answer", {"round_id": shown["round_id"], "turn": 1, "text": text}
            ).status_code
            == 200
        )
    for player in ("bob", "bob", "bob", "cy", "cy"):
        play_send(client, player)
    out = tmp_path / "report"
    main(Config(db=str(game.store.path), output_dir=str(out), resamples=200))
    report = json.loads((out / "human.json").read_text())
    assert report["answers"] == {"guess": len(guesses), "send": 5}
    rows = {(r["system"], r["mode"]): r for r in report["rows"]}
    assert set(rows) == {(s, m) for s in ("base", "sft") for m in ("single", "multi")}
    stored = game.store.answers()
    for (sender, _), row in rows.items():
        mine = [a["similarity"] for a in stored if a["sender"] == sender]
        assert row["rounds"] == len(mine) == 3
        assert row["similarity"] == pytest.approx(sum(mine) / 3)
        assert row["success@0.5"] == pytest.approx(sum(s >= 0.5 for s in mine) / 3)
        assert row["similarity_lo"] <= row["similarity"] <= row["similarity_hi"]
    assert (out / "human.png").stat().st_size > 0

    # Send mode: the leaderboard's numbers, with intervals; the judge's similarity on first turns.
    board = {(r["kind"], r["system"]): r for r in report["send_rows"]}
    assert [kind for kind, _ in board] == ["model", "model", "people", "person", "person"]
    assert set(board) == {
        ("model", "base"),
        ("model", "sft"),
        ("people", ALL_PEOPLE),
        ("person", "bob"),
        ("person", "cy"),
    }
    sent = [a for a in stored if a["mode"] == "send"]
    for who, mine in [
        (("person", "bob"), [a for a in sent if a["player"] == "bob"]),
        (("people", ALL_PEOPLE), sent),
        *(
            (("model", s), [a for a in stored if a["mode"] == "guess" and a["sender"] == s])
            for s in ("base", "sft")
        ),
    ]:
        row = board[who]
        scores = [a["judge_similarity"] for a in mine]
        assert row["rounds"] == len(scores) and row["similarity"] == pytest.approx(sum(scores) / len(scores))
        assert row["similarity_lo"] <= row["similarity"] <= row["similarity_hi"]
    web_board = {(r["kind"], r["name"]): r["score"] for r in client.get("/api/leaderboard").json()}
    for (kind, name), row in board.items():
        if kind != "people":  # the page's leaderboard shows the same numbers
            assert row["similarity"] == pytest.approx(web_board[kind, name])
    assert (out / "human_send.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "judge-human agreement" in printed and f"{ALL_PEOPLE}  people" in printed


def test_report_on_send_mode_alone(served, tmp_path, capsys):
    client, game, _ = served
    play_send(client, "dee")
    out = tmp_path / "report"
    main(Config(db=str(game.store.path), output_dir=str(out), resamples=200))
    report = json.loads((out / "human.json").read_text())
    assert report["rows"] == [] and [r["system"] for r in report["send_rows"]] == [ALL_PEOPLE, "dee"]
    assert report["send_rows"][0]["similarity_lo"] is None  # one round: no interval
    assert not (out / "human.png").exists() and (out / "human_send.png").exists()
    assert "guess mode" not in capsys.readouterr().out


def test_missing_or_empty_db_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        main(Config(db=str(tmp_path / "none.db"), output_dir=str(tmp_path)))
    assert not (tmp_path / "none.db").exists()
    Store(tmp_path / "empty.db")
    with pytest.raises(UserError, match="no answers yet"):
        main(Config(db=str(tmp_path / "empty.db"), output_dir=str(tmp_path)))
