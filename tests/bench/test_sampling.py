"""`make bench`'s engine_sampling arms, built here (the engine run is the benchmark): each arm is the
rollout sampler's own request with one field dropped, and the arms decode the same tokens."""

from emoji_rl.bench.sampling import PADDING_IDS, arm_rows, request_bodies
from emoji_rl.decode.vllm import PADDING_BIAS


def test_the_arms_differ_in_the_field_under_test_alone(smollm2_tokenizer):
    arms = {arm: request_bodies(smollm2_tokenizer, "policy", 6, arm) for arm in ("plain", "seeded", "biased")}
    vocab = len(smollm2_tokenizer)
    for i in range(6):
        plain, seeded, biased = (arms[arm][i] for arm in ("plain", "seeded", "biased"))
        assert "seed" not in plain and "logit_bias" not in plain
        assert {k: v for k, v in seeded.items() if k != "seed"} == plain and seeded["seed"] == 1000 + i
        assert {k: v for k, v in biased.items() if k != "logit_bias"} == plain
        assert biased["logit_bias"] == {str(t): PADDING_BIAS for t in range(vocab - PADDING_IDS, vocab)}
        # A fixed number of tokens: no stop ids, EOS ignored.
        assert (
            plain["ignore_eos"] is True and "stop_token_ids" not in plain and 8 <= plain["max_tokens"] <= 24
        )
    # Different prompts and lengths across requests: they leave the batch at different steps.
    assert len({len(body["prompt"]) + 1000 * body["max_tokens"] for body in arms["plain"]}) > 1
    assert len({tuple(body["prompt"]) for body in arms["plain"]}) == 6


def test_a_field_costing_more_than_5_percent_misses_the_goal():
    seeded, biased = arm_rows({"plain": 100.0, "seeded": 96.0, "biased": 94.0}, 256, "CPU engine")
    assert (seeded.ratio, seeded.met) == (0.96, True)
    assert (biased.ratio, biased.met) == (0.94, False)
    assert biased.name == "CPU engine tok/s, 256 requests: 243-id logit_bias / plain"
