"""A play-web server on 127.0.0.1 (a free port) with stand-in models: the tests of the web layer
need a sender, a judge and a scorer whose answers they know and can hold back, not real ones."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from emoji_rl.rl.judge import Guess, JudgeInput
from emoji_rl.web.app import make_server
from emoji_rl.web.game import Game
from emoji_rl.web.store import Store

TARGETS = [("t1", "let's grab pizza tonight"), ("t2", "the movie starts at nine"), ("t3", "I missed the bus")]


class StandInModels:
    """Sender: fixed emoji; judge: a fixed guess; similarity: word overlap (Jaccard), so a test can
    choose a guess's score. `hold` keeps the sender writing until released."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.hold.set()
        self.conversations: list[tuple[str, list[dict[str, str]]]] = []
        self.judged: list[JudgeInput] = []

    def write(self, sender, conversation, seed):
        self.conversations.append((sender, conversation))
        assert self.hold.wait(30)
        return "🍕 🎬"

    def judge(self, episode):
        self.judged.append(episode)
        return Guess(text="pizza and a movie", raw="pizza and a movie")

    def similarity(self, target, guess):
        a, b = set(target.lower().split()), set(guess.lower().split())
        return len(a & b) / len(a | b)


class Client:
    def __init__(self, base: str) -> None:
        self.http = httpx.Client(base_url=base, timeout=30)

    def get(self, path, **kw):
        return self.http.get(path, **kw)

    def post(self, path, body=None, **kw):
        return self.http.post(path, json=body, **kw)

    def wait(self, job: str) -> dict:
        for _ in range(300):
            status = self.get("/api/job", params={"id": job}).json()
            if status["state"] in {"done", "error"}:
                return status
            time.sleep(0.02)
        raise AssertionError(f"job {job} did not finish")

    def guess_round(self, player="ann") -> dict:
        started = self.post("/api/guess/start", {"player": player})
        assert started.status_code == 202, started.text
        status = self.wait(started.json()["job"])
        assert status["state"] == "done", status
        return status["result"]


@pytest.fixture
def senders(tmp_path):
    adapter = tmp_path / "sft_adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    return {"base": None, "sft": str(adapter)}


@pytest.fixture
def served(tmp_path, senders):
    """(client, game, stand-in models) with a server running on 127.0.0.1."""
    models = StandInModels()
    game = Game(Store(tmp_path / "answers.db"), models, senders, TARGETS, max_turns=2, tau=0.85, seed=0)
    server = make_server(game, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    client = Client(f"http://{host}:{port}")
    yield client, game, models
    models.hold.set()
    server.shutdown()
    server.server_close()
    game.close()
