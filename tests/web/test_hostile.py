"""play-web under hostile HTTP, over real sockets to a real server on 127.0.0.1: malformed and slow
requests, a crowd of idle connections, writes from another site, and what send mode may show.
Each answer is asserted, never how fast it came: a client waits up to WAIT_S for it."""

from __future__ import annotations

import contextlib

import pytest

from emoji_rl.errors import UserError
from emoji_rl.web.game import Game, for_send
from emoji_rl.web.store import Store

from .conftest import TARGETS, Client, StandInModels, serving


@pytest.fixture
def serve(tmp_path, senders):
    """A factory: (client, game, (host, port)) of a server with make_server's `options`."""

    @contextlib.contextmanager
    def start(**options):
        game = Game(Store(tmp_path / "answers.db"), StandInModels(), senders, TARGETS, max_turns=2, tau=0.85)
        with serving(game, **options) as base:
            host, port = base.removeprefix("http://").rsplit(":", 1)
            yield Client(base), game, (host, int(port))

    return start


def test_send_mode_never_shows_a_target_guess_mode_plays(serve):
    with serve() as (client, game, _):
        shown = {client.post("/api/send/start", {}).json()["target"] for _ in range(len(TARGETS) * 4)}
        assert not shown & set(game.targets.values())
        assert shown == set(game.send_targets.values())
        assert set(game.targets) | set(game.send_targets) == set(dict(TARGETS))
    # By the message, not its id nor its place: two copies of one message go to the same mode.
    assert for_send("the movie starts at nine") and for_send("The movie starts at NINE!")
    assert not for_send("I missed the bus") and not for_send("i missed the bus.")


def test_a_game_needs_targets_for_both_modes(tmp_path, senders):
    guess_only = [t for t in TARGETS if not for_send(t[1])]
    with pytest.raises(UserError, match="targets for both modes"):
        Game(Store(tmp_path / "a.db"), StandInModels(), senders, guess_only, max_turns=2, tau=0.85)
