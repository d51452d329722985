"""What a GRPO step logs of its servers (`rl/rollout/servers.py`), read from the fake vLLM server's
/metrics page while requests play: the hit rate over the step alone, the most requests it saw
waiting, and a server that cannot be read left out with one warning."""

from __future__ import annotations

import asyncio
import logging
import socket

import httpx
import pytest
from tests.fakes.vllm_server import FakeVLLMServer
from tests.rl.rollout.conftest import endpoint

from emoji_rl.io.endpoint import Endpoint
from emoji_rl.rl.rollout.servers import READ_TIMEOUT_S, ServerWatch, watched

POLL_S = 0.01
# Token-id prompts of 40 tokens: two whole blocks of the fake's 16 looked up, none shared between them.
FIRST, OTHER = list(range(300, 340)), list(range(500, 540))


async def complete(server, prompts):
    """Each prompt as its own request, all at once, as the vLLM sampler sends a turn."""
    body = {"model": "policy", "max_tokens": 4, "temperature": 1.0}
    headers = {"Authorization": "Bearer test-key"}
    async with httpx.AsyncClient(timeout=30) as client:
        sent = [
            client.post(server.url + "/v1/completions", json={**body, "prompt": p}, headers=headers)
            for p in prompts
        ]
        return [r.status_code for r in await asyncio.gather(*sent)]


def test_the_hit_rate_is_the_steps_own_and_the_load_its_peak(server):
    watch = ServerWatch({"policy": endpoint(server)}, poll_s=POLL_S)

    async def busy():
        # The engine busy with another request: the step's four wait until it is done.
        server._lock.acquire()
        sent = asyncio.ensure_future(complete(server, [FIRST] * 4))
        while server.stats.waiting < 4:
            await asyncio.sleep(POLL_S)
        # Long enough for the watch's polls to see them on a busy machine (5 polls' time was missed once).
        await asyncio.sleep(100 * POLL_S)
        server._lock.release()
        return await sent

    statuses, first = asyncio.run(watch.during(busy()))
    assert statuses == [200] * 4
    # The first request computes both blocks, the other three find them: 96 of 160 tokens.
    assert first["server/policy/prefix_cache_hit_rate"] == pytest.approx(96 / 160)
    assert first["server/policy/waiting"] == 4.0 and first["server/policy/running"] <= 1.0
    assert 0.0 <= first["server/policy/kv_cache_usage"] <= 1.0
    # A new prompt: nothing of it cached, whatever the server's counters say since it started.
    _, second = asyncio.run(watch.during(complete(server, [OTHER])))
    assert second["server/policy/prefix_cache_hit_rate"] == 0.0 and server.stats.hits == 96
    assert second["server/policy/waiting"] == 0.0
    # No request, no rate; the load is still read.
    _, idle = asyncio.run(watch.during(asyncio.sleep(0)))
    assert "server/policy/prefix_cache_hit_rate" not in idle and idle["server/policy/running"] == 0.0


def closed_port() -> str:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{free.getsockname()[1]}"


def test_a_server_that_cannot_be_read_is_left_out_with_one_warning(server, lm, monkeypatch, caplog):
    with FakeVLLMServer(lm, served_model_names=("judge",)) as other:
        monkeypatch.setattr(other.stats, "page", lambda name: "# not vLLM's page\n")
        servers = {"policy": endpoint(server), "judge": endpoint(other), "partner": Endpoint(closed_port())}
        watch = ServerWatch(servers, poll_s=POLL_S)
        with caplog.at_level(logging.WARNING, logger="emoji_rl.rollout.servers"):
            steps = [asyncio.run(watch.during(complete(server, [FIRST] * 2)))[1] for _ in range(2)]
    assert all({key.split("/")[1] for key in step} == {"policy"} for step in steps)
    # Both prompts found whole: as many blocks as leave out the last token, 32 of 40 tokens.
    assert steps[1]["server/policy/prefix_cache_hit_rate"] == 0.8
    warned = sorted(r.getMessage() for r in caplog.records)
    assert len(warned) == 2, warned
    assert "judge server" in warned[0] and "no vllm:prefix_cache_queries_total" in warned[0]
    assert "partner server" in warned[1] and "did not answer" in warned[1]


def test_each_server_is_read_once_with_one_short_try():
    policy = Endpoint("http://127.0.0.1:8002/v1", timeout_s=300.0)
    roles = watched(policy, {"judge": Endpoint("http://127.0.0.1:8002"), "partner": Endpoint("http://h:9")})
    assert list(roles) == ["policy", "partner"]
    assert list(watched(None, {"judge": policy})) == ["judge"]
    watch = ServerWatch(roles)
    assert all(e.attempts == 1 and e.timeout_s == READ_TIMEOUT_S for e in watch.servers.values())
