"""A play-web server on 127.0.0.1 (a free port) with stand-in models: the tests of the web layer
need a sender, a judge and a scorer whose answers they know and can hold back, not real ones. And a
headless Chromium for the browser tests (Debian's, installed here when missing: `chromium_paths`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from emoji_rl.play.guessing import Guess, JudgeInput
from emoji_rl.web.rounds import Rounds
from emoji_rl.web.server import make_server
from emoji_rl.web.store import Store

# Guess mode plays t1, t3 and t4; send mode t2 and t5 (`web.rounds.for_send`).
TARGETS = [
    ("t1", "let's grab pizza tonight"),
    ("t2", "the movie starts at nine"),
    ("t3", "I missed the bus"),
    ("t4", "my cat ate the cake"),
    ("t5", "we won the match"),
]


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

    def stop(self):
        self.hold.set()


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


@contextlib.contextmanager
def serving(game: Rounds, **options) -> Iterator[str]:
    """The game served on 127.0.0.1 (a free port) from a thread: yields its base URL. `options`:
    make_server's limits."""
    server = make_server(game, "127.0.0.1", 0, **options)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for _ in range(3000):  # bound, listening already: what is left is uvicorn's start, milliseconds
        if server.started or not thread.is_alive():
            break
        time.sleep(0.01)
    assert server.started, "play-web's server did not start in 30 s"
    host, port = server.server_address
    try:
        yield f"http://{host}:{port}"
    finally:
        server.shutdown()
        thread.join(30)
        server.server_close()
        game.close()


@pytest.fixture
def served(tmp_path, senders):
    """(client, game, stand-in models) with a server running on 127.0.0.1."""
    models = StandInModels()
    game = Rounds(Store(tmp_path / "answers.db"), models, senders, TARGETS, max_turns=2, tau=0.85, seed=0)
    with serving(game) as base:
        yield Client(base), game, models
        models.hold.set()


# Debian's browser and its matching driver: a browser downloaded at install time (Playwright's,
# Selenium Manager's) cannot work on a machine that reaches only the package registries.
CHROMIUM_PACKAGES = ("chromium", "chromium-driver")
# Chromium draws emoji with the system's fonts: without a colour emoji font, a screenshot shows
# empty boxes where the page shows the senders' emoji (the tests read text, so they pass either way).
EMOJI_FONT, EMOJI_FONT_PACKAGE = "Noto Color Emoji", "fonts-noto-color-emoji"


def _chromium() -> tuple[str | None, str | None]:
    return shutil.which("chromium"), shutil.which("chromedriver")


def has_emoji_font() -> bool:
    fc_list = shutil.which("fc-list")  # fontconfig, which chromium depends on
    found = subprocess.run([fc_list, EMOJI_FONT], capture_output=True, text=True) if fc_list else None
    return bool(found and EMOJI_FONT in found.stdout)


def _apt_get_install(packages: list[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        # A fresh machine's package lists may be missing or stale: refresh them once, then retry.
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"`{' '.join(install)}` failed ({done.returncode}): {done.stderr[-2000:]}")


@pytest.fixture(scope="session")
def chromium_paths() -> tuple[str, str]:
    """(browser, driver), apt-get installing them and the emoji font when missing and running as
    root (as on CI); otherwise a missing browser fails the test naming the packages. A session
    fixture rather than a `make test` prerequisite: it runs only when a browser test is selected,
    under plain `pytest` too (CI steps, an editor), and costs two PATH look-ups and one fc-list
    once installed."""
    browser, driver = _chromium()
    missing = [] if browser and driver else list(CHROMIUM_PACKAGES)
    if not has_emoji_font():
        missing.append(EMOJI_FONT_PACKAGE)
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        _apt_get_install(missing)
        browser, driver = _chromium()
    if not (browser and driver):
        names = " ".join(CHROMIUM_PACKAGES)
        pytest.fail(f"the browser tests need Debian's {names}: sudo apt-get install {names}")
    return browser, driver


@pytest.fixture(scope="session")
def browser(chromium_paths):
    """One headless Chromium for the session, driven through Debian's chromedriver (given
    explicitly, so Selenium Manager never tries to download a driver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = chromium_paths
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=900,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    yield driver
    driver.quit()
