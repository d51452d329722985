"""`make bench`'s play-web rows at a tiny size: both servers start (the threaded one from git history),
answer the load, and the rows print; outside a git checkout the row says what it needs."""

from __future__ import annotations

import subprocess

import pytest

from emoji_rl.bench import web

# A shallow clone (CI may make one) lacks the commit the threaded server is taken from; the row's own
# error for that case is checked below.
needs_history = pytest.mark.skipif(
    subprocess.run(
        ["git", "cat-file", "-e", f"{web.THREADED_COMMIT}^{{commit}}"], capture_output=True
    ).returncode
    != 0,
    reason=f"this clone lacks commit {web.THREADED_COMMIT[:10]} (shallow?)",
)


@needs_history
@pytest.mark.slow  # two servers start, each importing torch through the game: ~15 s
def test_the_rows_measure_both_servers_at_a_tiny_size():
    rows = web.bench_play_web(requests=40, concurrency=5, idle=20, rounds=1)
    assert [r.name.split(" req/s")[0] for r in rows[:2]] == [
        "play-web GET /",
        "play-web GET /api/leaderboard",
    ]
    assert all(r.ratio > 0 for r in rows)
    held = rows[2]
    # 20 idle connections are under both servers' caps: each keeps every one open.
    assert held.measured.endswith("(20 held)") and held.baseline.endswith("(20 held)"), held


@needs_history
def test_the_threaded_server_comes_from_git_history(tmp_path):
    src = web.threaded_tree(tmp_path)
    server = (src / "emoji_rl" / "web" / "server.py").read_text()
    assert "ThreadingHTTPServer" in server and (src / "emoji_rl" / "web" / "static" / "index.html").is_file()


def test_outside_a_git_checkout_the_row_says_it_needs_one(tmp_path):
    outside = tmp_path / "not-a-clone"
    outside.mkdir()
    assert subprocess.run(["git", "rev-parse"], cwd=outside, capture_output=True).returncode != 0
    with pytest.raises(RuntimeError, match="not in a git checkout: run `make bench` from a clone"):
        web.threaded_tree(tmp_path / "out", source=outside)
