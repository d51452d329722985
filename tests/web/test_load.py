"""Load: 20 simulated players play at once for half a minute against a play-web server on 127.0.0.1
(stand-in models, tests/web/conftest.py: the load is on the server and the store, not on models),
double submits and double "another turn" requests included; then every answer a player was told
was stored is in SQLite exactly once, and no other answer is. Bounded: half a minute and at most
MAX_ROUNDS rounds per player, however fast the server answers."""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest

from emoji_rl.web.store import Store

PLAYERS = 20
PLAY_S = 30.0
MAX_ROUNDS = 400  # per player
THINK_S = 0.08  # a player's pause before each action, at most: people are slower still
DOUBLE = 0.3  # share of answers and "another turn" requests a player sends twice at once
SEND_EMOJI = ["🍕 🎬", "🚌 😢", "🎬 🕘 🌙", "🍕 🍕 🌙"]


def at_once(*requests: Callable[[], httpx.Response]) -> list[httpx.Response]:
    """The requests sent at the same moment, each from its own thread: a double click, two tabs."""
    start = threading.Barrier(len(requests))

    def send(request: Callable[[], httpx.Response]) -> httpx.Response:
        start.wait()
        return request()

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(send, requests))


@dataclass
class Player:
    name: str
    base: str
    seed: int
    stored: list[tuple[str, int, str, str]] = field(default_factory=list)  # what the server said it kept
    answer_ids: dict[tuple[str, int], int] = field(default_factory=dict)
    doubles: int = 0
    requests: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.tabs = [httpx.Client(base_url=self.base, timeout=30) for _ in range(2)]  # two tabs

    def post(self, path: str, body: dict, tab: int = 0) -> httpx.Response:
        self.requests += 1
        return self.tabs[tab].post(path, json=body)

    def wait(self, job: str) -> dict:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.requests += 1
            status = self.tabs[0].get("/api/job", params={"id": job}).json()
            if status["state"] in {"done", "error"}:
                return status
            time.sleep(0.02)
        raise AssertionError(f"{self.name}: job {job} did not finish in 30 s")

    def think(self) -> None:
        time.sleep(self.rng.uniform(0, THINK_S))

    def twice(self, path: str, body: dict, second: dict | None = None) -> list[httpx.Response]:
        """`body` from one tab and `second` (default: the same) from the other, at the same moment."""
        self.doubles += 1
        self.requests += 2
        return at_once(
            lambda: self.tabs[0].post(path, json=body), lambda: self.tabs[1].post(path, json=second or body)
        )

    def play(self, until: float) -> None:
        for k in range(MAX_ROUNDS):
            if time.monotonic() >= until:
                return
            self.think()
            if self.rng.random() < 0.7:
                self.guess_round(k)
            else:
                self.send_round()

    def guess_round(self, k: int) -> None:
        started = self.post("/api/guess/start", {"player": self.name})
        assert started.status_code == 202, started.text
        status = self.wait(started.json()["job"])
        assert status["state"] == "done", status
        round_id, turn = status["result"]["round_id"], 1
        while True:
            self.think()
            answer = self.answer(round_id, turn, f"{self.name} {k}.{turn}")
            if not answer["can_continue"] or self.rng.random() < 0.3:
                return
            self.think()
            body = {"round_id": round_id, "turn": turn}
            if self.rng.random() < DOUBLE:  # both get a job, and both jobs the same turn
                responses = self.twice("/api/guess/next", body)
            else:
                responses = [self.post("/api/guess/next", body)]
            assert all(r.status_code == 202 for r in responses), [r.text for r in responses]
            result, *repeats = [self.wait(r.json()["job"])["result"] for r in responses]
            assert result["round_id"] == round_id and result["turn"] == turn + 1, result
            assert all(repeat == result for repeat in repeats), (result, repeats)
            turn += 1

    def answer(self, round_id: str, turn: int, text: str) -> dict:
        body = {"round_id": round_id, "turn": turn, "text": text}
        if self.rng.random() < DOUBLE:  # a double submit, the second tab typing something else
            second = {**body, "text": text + " (again)"}
            responses = self.twice("/api/guess/answer", body, second)
            assert sorted(r.status_code for r in responses) == [200, 409], [r.text for r in responses]
            (refused,) = [r for r in responses if r.status_code == 409]
            assert "answered already" in refused.json()["error"], refused.text
            (ok,) = [r for r in responses if r.status_code == 200]
        else:
            ok = self.post("/api/guess/answer", body)
            assert ok.status_code == 200, ok.text
        kept = ok.json()
        self.stored.append((round_id, turn, "guess", kept["guess"]))
        self.answer_ids[round_id, turn] = kept["answer_id"]
        return kept

    def send_round(self) -> None:
        shown = self.post("/api/send/start", {"player": self.name})
        assert shown.status_code == 200, shown.text
        round_id = shown.json()["round_id"]
        self.think()
        emoji = self.rng.choice(SEND_EMOJI)
        body = {"round_id": round_id, "emoji": emoji}
        if self.rng.random() < DOUBLE:
            responses = self.twice("/api/send/answer", body)
        else:
            responses = [self.post("/api/send/answer", body)]
        # A repeat gets the first one's job while it runs, else a clear refusal, as a 409 or as the
        # error of its job: never a second judgement stored.
        done, refused = [], []
        for r in responses:
            if r.status_code == 409:
                refused.append(r.json()["error"])
                continue
            assert r.status_code == 202, r.text
            status = self.wait(r.json()["job"])
            (done if status["state"] == "done" else refused).append(status["result"] or status["error"])
        assert done and all("answered already" in e for e in refused), (done, refused)
        assert all(result == done[0] for result in done) and done[0]["emoji"] == emoji
        self.stored.append((round_id, 1, "send", emoji))

    def close(self) -> None:
        for tab in self.tabs:
            tab.close()


@pytest.mark.slow
def test_twenty_players_at_once_lose_and_duplicate_no_answer(served):
    client, game, _ = served
    base = str(client.http.base_url).rstrip("/")
    players = [Player(f"player{i:02d}", base, seed=i) for i in range(PLAYERS)]
    go = threading.Barrier(PLAYERS)  # all start at once
    until = time.monotonic() + PLAY_S
    failures: list[str] = []

    def run(player: Player) -> None:
        try:
            go.wait()
            player.play(until)
        except BaseException:  # reported below, with the player's name
            failures.append(f"{player.name}: {traceback.format_exc(limit=-4)}")
        finally:
            player.close()

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in players]
    for thread in threads:
        thread.start()
    for thread in threads:  # a round in flight when the time is up: a few requests, 30 s each at most
        thread.join(max(0.0, until + 120 - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "players still playing two minutes after the time was up"
    assert not failures, "\n".join(failures[:3])
    game.store.close()

    rows = Store(game.store.path).answers()  # a fresh connection: what is on disk
    keys = Counter((r["round_id"], r["turn"]) for r in rows)
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1][:5]
    told = {(*answer, p.name) for p in players for answer in p.stored}
    kept = {(r["round_id"], r["turn"], r["mode"], r["text"], r["player"]) for r in rows}
    assert sum(len(p.stored) for p in players) == len(told)  # no player was told twice
    assert kept == told, (sorted(told - kept)[:5], sorted(kept - told)[:5])
    ids = {(r["round_id"], r["turn"]): r["id"] for r in rows}
    assert all(ids[key] == answer_id for p in players for key, answer_id in p.answer_ids.items())

    requests, doubles = sum(p.requests for p in players), sum(p.doubles for p in players)
    print(f"\n{PLAYERS} players, {PLAY_S:.0f} s: {len(rows)} answers, {doubles} doubles, {requests} requests")
    # Every player played throughout, and the doubles ran: a load, not a trickle.
    assert min(len(p.stored) for p in players) >= 20 and doubles >= 100
