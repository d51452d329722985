"""Reading a vLLM server's prefix-cache counters, cache config and load from its /metrics page, on a
page the real engine served (tests/fixtures/README.md) and on lines written here for what it did not
show (several engines, labels with spaces and braces, a busy server)."""

from pathlib import Path

import pytest

from emoji_rl.errors import UserError
from emoji_rl.io.server_metrics import (
    PrefixCache,
    ServerLoad,
    cache_config,
    prefix_cache_counters,
    server_load,
)

PAGE = (Path(__file__).parents[1] / "fixtures" / "vllm_metrics_hybrid.txt").read_text()


def test_the_engines_page_gives_its_counters_and_not_the_ones_beside_them():
    # The page also has the counters' `_created` gauges (timestamps near 1.8e9), the KV connector's
    # `external_prefix_cache_*` (0 here) and their HELP and TYPE lines: none may be added in.
    assert "vllm:prefix_cache_queries_created{" in PAGE and "vllm:external_prefix_cache_hits_total{" in PAGE
    counters = prefix_cache_counters(PAGE)
    assert counters == PrefixCache(queries=37858, hits=24656)
    assert counters.rate == pytest.approx(24656 / 37858)


def test_the_engines_cache_config_says_the_block_it_settled_on():
    config = cache_config(PAGE)
    # A hybrid model's attention block, widened by vLLM to hold a Gated DeltaNet state, and the unit
    # its hits land on.
    assert config["block_size"] == "640" and config["prefix_match_unit"] == "16"
    assert config["mamba_cache_mode"] == "align" and config["enable_prefix_caching"] == "True"
    assert cache_config("vllm:num_requests_running 0.0\n") == {}


def test_every_engine_counts_and_labels_may_hold_spaces_and_braces():
    page = "\n".join(
        [
            "# TYPE vllm:prefix_cache_queries_total counter",
            'vllm:prefix_cache_queries_total{engine="0",model_name="my policy {v2}"} 100.0',
            'vllm:prefix_cache_queries_total{engine="1",model_name="my policy {v2}"} 50.0 1700000000000',
            'vllm:prefix_cache_hits_total{engine="0",model_name="my policy {v2}"} 60.0',
            'vllm:prefix_cache_hits_total{engine="1",model_name="my policy {v2}"} 15.0',
            'vllm:prefix_cache_hits_created{engine="0",model_name="my policy {v2}"} 1.79e+09',
        ]
    )
    assert prefix_cache_counters(page) == PrefixCache(150, 75)
    assert cache_config('vllm:cache_config_info{block_size="16",note="a \\"quoted\\" }"} 1.0') == {
        "block_size": "16",
        "note": 'a \\"quoted\\" }',
    }


def test_a_page_without_the_counters_says_which_is_missing():
    with pytest.raises(UserError, match="no vllm:prefix_cache_hits_total on the metrics page"):
        prefix_cache_counters('vllm:prefix_cache_queries_total{engine="0"} 3.0\n')
    with pytest.raises(UserError, match="prefix_cache_queries_total or vllm:prefix_cache_hits_total"):
        prefix_cache_counters("")


def test_counters_over_an_interval_are_the_difference():
    before, after = PrefixCache(1000, 400), PrefixCache(1800, 1000)
    assert after - before == PrefixCache(800, 600) and (after - before).rate == 0.75
    assert PrefixCache(0, 0).rate == 0.0  # no request in the interval


def test_the_engines_page_gives_its_load():
    # Served idle, after the bench's requests: nothing running, nothing queued, no block in use (the
    # cached prefixes' blocks count as free). `num_requests_waiting_by_reason` is another gauge.
    assert "vllm:num_requests_waiting_by_reason{" in PAGE
    assert server_load(PAGE) == ServerLoad(PrefixCache(37858, 24656), 0.0, 0, 0)


def test_a_busy_server_with_two_engines_sums_its_requests_and_averages_its_cache_usage():
    labels = '{engine="%d",model_name="policy"}'
    page = "\n".join(
        [
            *(
                f"vllm:prefix_cache_{kind}_total{labels % e} {n}"
                for e in (0, 1)
                for kind, n in (("queries", 90.0), ("hits", 30.0))
            ),
            f"vllm:kv_cache_usage_perc{labels % 0} 0.75",
            f"vllm:kv_cache_usage_perc{labels % 1} 0.25",
            f"vllm:num_requests_running{labels % 0} 12.0",
            f"vllm:num_requests_running{labels % 1} 4.0",
            f"vllm:num_requests_waiting{labels % 0} 3.0",
            f"vllm:num_requests_waiting{labels % 1} 0.0",
            'vllm:num_requests_waiting_by_reason{engine="0",model_name="policy",reason="capacity"} 3.0',
        ]
    )
    assert server_load(page) == ServerLoad(PrefixCache(180, 60), 0.5, 16, 3)
    with pytest.raises(UserError, match="no vllm:kv_cache_usage_perc on the metrics page"):
        server_load(page.replace("kv_cache_usage_perc", "gpu_cache_usage_perc"))
