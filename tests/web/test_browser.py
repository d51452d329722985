"""play-web as a person plays it: a headless Chromium (Debian's, `chromium_paths`) clicks through
both modes, reloads, and the test then reads the stored rows and the `eval-human` report. The
stand-in models test the page (what it shows, what it stores, escaping); one test plays the
embedded models through `emoji-rl play-web`, the command a person runs.

Set EMOJI_RL_SCREENSHOTS=DIR to keep that test's screenshots of each mode (docs/ holds them)."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emoji_rl.eval.human import Config as HumanConfig
from emoji_rl.eval.human import main as eval_human
from emoji_rl.web.store import Store

from .conftest import TARGETS


class Page:
    """The play-web page in the browser, by the element ids of static/index.html."""

    def __init__(self, driver, base: str) -> None:
        self.driver, self.base = driver, base

    def open(self) -> None:
        self.driver.get(self.base)
        self.until(lambda d: d.execute_script("return document.body.dataset.ready === 'true'"))

    def until(self, condition, timeout: float = 30):
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(condition)

    def el(self, id_: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, id_)

    def shown(self, id_: str, timeout: float = 30):
        """Wait for element `id_` to show; an error the page shows meanwhile fails at once."""

        def check(_):
            if self.el("error").is_displayed():
                raise AssertionError(f"the page says: {self.text('error')}")
            return self.el(id_).is_displayed()

        self.until(check, timeout)

    def text(self, id_: str) -> str:
        return self.el(id_).text

    def type(self, id_: str, text: str) -> None:
        box = self.el(id_)
        box.clear()
        box.send_keys(text)

    def click(self, id_: str) -> None:
        self.el(id_).click()

    def turns(self) -> list[str]:
        from selenium.webdriver.common.by import By

        return [li.text for li in self.driver.find_elements(By.CSS_SELECTOR, "#guess-turns li")]

    def guess(self, text: str, turn: int, timeout: float = 30) -> None:
        """Wait for the sender's turn `turn`, then submit `text` and wait for the scores."""
        self.until(
            lambda _: self.el("guess-form").is_displayed() and self.text("guess-turn") == str(turn), timeout
        )
        self.type("guess-text", text)
        self.click("guess-submit")
        self.shown("guess-result")

    def pick(self, search: str, n: int) -> None:
        """Click the first `n` emoji the picker offers for `search`."""
        from selenium.webdriver.common.by import By

        self.type("send-search", search)
        for button in self.driver.find_elements(By.CSS_SELECTOR, "#picker button")[:n]:
            button.click()

    def screenshot(self, name: str, tmp_path: Path) -> Path:
        path = tmp_path / name
        assert self.driver.save_screenshot(str(path)), path
        if keep := os.environ.get("EMOJI_RL_SCREENSHOTS"):
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(keep) / name)
        return path


def test_a_person_plays_both_modes_in_chromium(browser, served, tmp_path):
    client, game, _ = served
    page = Page(browser, str(client.http.base_url).rstrip("/"))
    page.open()
    page.type("player", "ann")
    page.click("guess-new")
    # Typed markup is shown as text and never runs (the page writes with textContent; CSP).
    markup = "<b>bold</b><script>window.pwned = 1</script>"
    page.guess(markup, turn=1)
    (turn,) = page.turns()
    assert turn.startswith("🍕 🎬") and f"you: {markup} (0.00)" in turn
    assert browser.find_elements("css selector", "#guess-turns b") == []
    assert browser.execute_script("return window.pwned") is None
    target = page.text("guess-target")
    assert target in dict(TARGETS).values()
    assert page.text("guess-judge") == "pizza and a movie"
    page.click("guess-next")  # 0.00 < tau: another turn
    page.guess(target, turn=2)
    assert page.text("guess-score") == "1.00" and not page.el("guess-next").is_displayed()  # max_turns=2

    browser.refresh()  # a reload starts afresh, remembers the name, and stores nothing more
    page.open()
    assert page.el("player").get_attribute("value") == "ann"
    assert not page.el("guess-form").is_displayed() and page.turns() == []

    page.click("tab-send")
    page.click("send-new")
    page.shown("send-form")
    assert page.text("send-target") in dict(TARGETS).values()
    page.pick("pizza", 1)
    page.click("send-submit")  # one emoji: the models' parser refuses it, the page says why
    page.until(lambda _: "too few emoji" in page.text("error"))
    page.pick("moon", 1)
    page.click("send-submit")
    page.shown("send-result")
    assert page.text("send-judge") == "pizza and a movie"

    page.click("tab-board")
    page.until(lambda _: "ann" in page.text("board-rows"))
    assert "person" in page.text("board-rows")

    rows = Store(game.store.path).answers()
    assert [(r["mode"], r["turn"], r["player"]) for r in rows] == [
        ("guess", 1, "ann"),
        ("guess", 2, "ann"),
        ("send", 1, "ann"),
    ]
    assert rows[0]["text"] == markup and rows[1]["text"] == target and rows[1]["similarity"] == 1.0
    assert rows[2]["emoji"].startswith("🍕 ") and len(rows[2]["emoji"].split(" ")) == 2
    out = tmp_path / "report"
    eval_human(HumanConfig(db=str(game.store.path), output_dir=str(out), resamples=200))
    report = json.loads((out / "human.json").read_text())
    assert report["answers"] == 2  # guess mode only: the human evaluation
    by_mode = {r["mode"]: r for r in report["rows"]}
    assert by_mode["single"]["similarity"] == 0.0 and by_mode["multi"]["similarity"] == 1.0


def _start_play_web(args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """`emoji-rl play-web` in a child process; (process, URL) once it says it is serving."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "emoji_rl.cli", "play-web", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=1):
                line = proc.stdout.readline()
                if line.startswith("play-web: http://"):
                    return proc, line.split()[1].rstrip("/")
    proc.kill()
    raise AssertionError(f"play-web did not start: {log.read_text()[-3000:]}")


@pytest.mark.slow
def test_a_person_plays_the_embedded_models(browser, tmp_path):
    data = tmp_path / "eval.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"c{i}", "target": t}) + "\n" for i, (_, t) in enumerate(TARGETS))
    )
    db, log = tmp_path / "answers.db", tmp_path / "play-web.log"
    started = time.perf_counter()
    proc, base = _start_play_web(["--systems", "base", "--data", str(data), "--db", str(db)], log)
    try:
        ready_s = time.perf_counter() - started
        page = Page(browser, base)
        page.open()
        page.type("player", "bea")
        clicked = time.perf_counter()
        page.click("guess-new")
        page.shown("guess-form", timeout=60)
        first_turn_s = time.perf_counter() - clicked
        (emoji,) = page.turns()
        page.guess("pizza tonight", turn=1)
        assert 0 < float(page.text("guess-score")) <= 1
        assert page.text("guess-judge")  # the hf judge's guess of the same emoji
        page.screenshot("play_web_guess.png", tmp_path)

        browser.refresh()
        page.open()
        page.click("tab-send")
        page.click("send-new")
        page.shown("send-form")
        page.pick("pizza", 1)
        page.pick("moon", 1)
        clicked = time.perf_counter()
        page.click("send-submit")
        page.shown("send-result", timeout=60)
        judge_s = time.perf_counter() - clicked
        page.screenshot("play_web_send.png", tmp_path)
        page.click("tab-board")
        page.until(lambda _: "bea" in page.text("board-rows"))
        page.screenshot("play_web_leaderboard.png", tmp_path)
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: the server closes the store and exits
        proc.wait(30)
    warmed = [line for line in log.read_text().splitlines() if "models loaded in" in line]
    print(f"\nplay-web ready {ready_s:.1f} s; first turn {first_turn_s:.1f} s; send judged {judge_s:.1f} s")
    print(*warmed, sep="\n")
    assert warmed, log.read_text()[-3000:]
    # Warmed at start-up, a turn is a few seconds on 2 busy cores (it was minutes before: issue 17).
    assert first_turn_s < 30 and judge_s < 30

    rows = Store(db).answers()
    assert [(r["mode"], r["player"], r["sender"]) for r in rows] == [
        ("guess", "bea", "base"),
        ("send", "bea", "person"),
    ]
    assert rows[0]["emoji"] == emoji and rows[0]["text"] == "pizza tonight"
    out = tmp_path / "report"
    eval_human(HumanConfig(db=str(db), output_dir=str(out), resamples=200))
    single, _multi = json.loads((out / "human.json").read_text())["rows"]
    assert single["system"] == "base" and single["rounds"] == 1
    assert single["similarity"] == pytest.approx(rows[0]["similarity"])
