"""GRPO with its rollouts one version behind the update (`max_off_policy_steps` 1) against the fake vLLM
server: a function of its seed whatever the timing, resumed with a step in flight to the same end, a
server that dies during the next step's rollouts named, a trainer that dies taking its rollout
thread with it, and what the policy and judge servers say of each step logged beside it."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import threading
import time
import zlib
from pathlib import Path

import pytest
from tests.fakes.fake_lm import FakeLM
from tests.fakes.vllm_server import FakeVLLMServer
from tests.rl.test_train import Interrupted, _comparable, _read_jsonl, _toy_setup, favorite_setup

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.vllm import VLLMSampler
from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import Endpoint
from emoji_rl.io.metrics import read_metrics
from emoji_rl.lm import template
from emoji_rl.rl import train as grpo_train
from emoji_rl.rl import trainer as grpo_trainer
from emoji_rl.rl.checkpoint import behaviour_adapters, latest_checkpoint
from emoji_rl.rl.rollout import schedule
from emoji_rl.rl.rollout.vllm import AdapterSync

pytestmark = pytest.mark.slow

KEY_ENV = "EMOJI_RL_TEST_POLICY_KEY"
RECORDS = [{"id": f"p{i}", "target": "I love the sunny weather today"} for i in range(3)]
TARGETS = ("let's get pizza tonight", "the train is late again")


class WeightsServer(FakeVLLMServer):
    """The fake server, its model's logits keyed by an adapter's weights rather than its name and
    folder, as a real server's are: two runs (or a run and its resume, under another session) that
    publish the same weights sample the same. `delay` answers each completion after a random pause."""

    def __init__(self, lm, delay=0.0, seed=0):
        super().__init__(lm, logprobs_mode="processed_logprobs")
        self.delay, self.rng = delay, random.Random(seed)

    def _resolve(self, name):
        echoed, key = super()._resolve(name)
        if name in self.adapters:
            weights = Path(self.adapters[name].path) / "adapter_model.safetensors"
            key = "lora:" + hashlib.sha256(weights.read_bytes()).hexdigest()
        return echoed, key

    def dispatch(self, method, path, headers, raw):
        if self.delay and path == "/v1/completions":
            time.sleep(self.rng.uniform(0, self.delay))
        return super().dispatch(method, path, headers, raw)


def message_hash(emoji):
    """A reward the fake model's samples vary in (it is not the policy: nothing is learned)."""
    return zlib.crc32("".join(emoji).encode()) / 2**32


def run(tmp_path, server, session, key_env=KEY_ENV, score=message_hash, **overrides):
    """The toy one-turn game's GRPO (tests/rl/test_train.py) with a vLLM sampler at `server`; the
    final state and the run directory."""
    settings = dict(engine="vllm", max_off_policy_steps=1, max_steps=4, group_size=4, save_steps=1, seed=0)
    cfg, tokenizer, policy, _ = _toy_setup(tmp_path, **{**settings, **overrides})
    endpoint = Endpoint(server.url + "/v1", api_key_env=key_env, backoff_s=0.01, attempts=2)
    decoding = Decoding(max_new_tokens=16, max_emoji=4)
    sampler = VLLMSampler(endpoint, "policy", template.stop_token_id(tokenizer), decoding)
    sync = AdapterSync(sampler, cfg.output_dir, "policy", keep=cfg.vllm_adapter_keep, session=session)
    setup = favorite_setup(tokenizer, RECORDS, score)
    return grpo_train.train(cfg, policy, tokenizer, setup, sampler, weight_sync=sync), Path(cfg.output_dir)


@pytest.fixture
def lm(smollm2_tokenizer, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    return FakeLM(smollm2_tokenizer)


def test_one_version_behind_the_run_is_a_function_of_its_seed_whatever_the_timing(lm, tmp_path):
    with WeightsServer(lm) as fast:
        state, quick = run(tmp_path / "fast", fast, "aaa")
        models = [body["model"] for body in fast.bodies("/v1/completions")]
    with WeightsServer(lm, delay=0.05, seed=1) as slow:
        _, late = run(tmp_path / "slow", slow, "aaa")
    assert state.step == 4
    metrics = read_metrics(quick)
    assert _comparable(metrics) == _comparable(read_metrics(late))
    assert _read_jsonl(quick / "rollouts.jsonl") == _read_jsonl(late / "rollouts.jsonl")
    # Step t (1-based in the logs) was sampled by the adapter of step t-2: 0, 0, 1, 2.
    assert [m["async/version_lag"] for m in metrics] == [0.0, 1.0, 1.0, 1.0]
    served = [int(name.rsplit("-v", 1)[1]) for name in dict.fromkeys(models)]
    assert served == [0, 1, 2]  # steps 1 and 2 both by version 0, then one version each
    assert all(m["async/dropped_episodes"] == 0 for m in metrics)
    lagged = [m for m in metrics if m["async/version_lag"] == 1 and m["optim/skipped"] == 0]
    assert lagged and all(m["sampler/lag1/tokens"] > 0 and "sampler/lag0/tokens" not in m for m in lagged)
    # Each turn the rollout log shows carries the version that sampled it.
    versions = {
        r["step"]: {t["sampler_version"] for t in r["turns"]} for r in _read_jsonl(quick / "rollouts.jsonl")
    }
    assert versions == {1: {0}, 2: {0}, 3: {1}, 4: {2}}


def test_a_run_killed_with_a_step_in_flight_resumes_to_the_uninterrupted_end(lm, tmp_path, monkeypatch):
    with WeightsServer(lm) as server:
        _, whole = run(tmp_path / "whole", server, "aaa")

        # Dies as it writes step 3's checkpoint: step 4's rollouts are in flight (or played), lost.
        real_save = grpo_trainer.save_checkpoint

        def save_or_die(run_dir, state, *args, **kwargs):
            if state.step == 3:
                raise Interrupted
            return real_save(run_dir, state, *args, **kwargs)

        with monkeypatch.context() as patch, pytest.raises(Interrupted):
            patch.setattr(grpo_trainer, "save_checkpoint", save_or_die)
            run(tmp_path / "split", server, "bbb")
        split = tmp_path / "split" / "run"
        checkpoint = latest_checkpoint(split)
        assert checkpoint.name == "step-000002"
        # Step 3 is sampled by version 1: the checkpoint holds it, for a resume to sample alike.
        assert sorted(behaviour_adapters(checkpoint)) == [1]
        assert not any(t.name == "rollouts-ahead" for t in threading.enumerate())

        state, _ = run(tmp_path / "split", server, "ccc", resume=True)
    assert state.step == 4
    assert [m["step"] for m in read_metrics(split)] == [1, 2, 3, 4]
    assert _comparable(read_metrics(split)) == _comparable(read_metrics(whole))
    assert _read_jsonl(split / "rollouts.jsonl") == _read_jsonl(whole / "rollouts.jsonl")


def test_a_server_that_dies_during_the_next_steps_rollouts_is_named_and_a_resume_goes_on(
    lm, tmp_path, monkeypatch
):
    server = WeightsServer(lm).start()
    real_publish = schedule.publish_weights

    def publish_then_die(sync, accelerator, model, version):
        name = real_publish(sync, accelerator, model, version)
        if version == 2:
            server.stop()  # step 3's rollouts, sampled by this version, find no server
        return name

    with monkeypatch.context() as patch, pytest.raises(UserError) as failed:
        patch.setattr(schedule, "publish_weights", publish_then_die)
        run(tmp_path, server, "aaa")
    assert server.url in str(failed.value)
    out = tmp_path / "run"
    checkpoint = latest_checkpoint(out)
    assert checkpoint is not None and checkpoint.name in ("step-000001", "step-000002")
    done = int(checkpoint.name.removeprefix("step-"))
    assert [m["step"] for m in read_metrics(out)] == list(range(1, done + 1))

    with WeightsServer(lm) as again:
        state, _ = run(tmp_path, again, "bbb", resume=True)
    assert state.step == 4 and [m["step"] for m in read_metrics(out)] == [1, 2, 3, 4]


def test_a_trainer_that_dies_stops_its_rollouts(lm, tmp_path, monkeypatch):
    class TrainerDied(Exception):
        pass

    real_update = grpo_trainer.update
    updates = []

    def update_then_die(*args, **kwargs):
        updates.append(1)
        if len(updates) == 2:
            time.sleep(0.5)  # step 3's rollouts are on their way by now
            raise TrainerDied
        return real_update(*args, **kwargs)

    with WeightsServer(lm, delay=0.2) as server:
        with monkeypatch.context() as patch, pytest.raises(TrainerDied):
            patch.setattr(grpo_trainer, "update", update_then_die)
            run(tmp_path, server, "aaa", max_steps=6, save_steps=100)
        assert not any(t.name == "rollouts-ahead" for t in threading.enumerate())
        sent = len(server.bodies("/v1/completions"))
        time.sleep(1.0)
        assert len(server.bodies("/v1/completions")) == sent  # nothing more reaches the server
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1


def test_each_step_logs_what_the_policy_and_judge_servers_say_of_it(lm, tmp_path, capsys):
    """The retrieval game, two turns, its judge on a server of its own: each step's line holds both
    servers' prefix-cache hit rate over the step (a group shares its opening, and turn 2 resends turn
    1), the most KV cache they used, and their requests running and waiting."""
    from emoji_rl import cli

    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps({"id": f"t{i}", "target": t}) + "\n" for i, t in enumerate(TARGETS)))
    out = tmp_path / "run"
    with (
        FakeVLLMServer(lm, logprobs_mode="processed_logprobs") as policy,
        FakeVLLMServer(lm, served_model_names=("judge",)) as judge,
    ):
        served = ["--engine", "vllm", "--vllm_url", policy.url, "--vllm_api_key_env", KEY_ENV]
        judged = ["--judge", "openai", "--judge_url", judge.url, "--judge_model", "judge"]
        judged += ["--judge_api_key_env", KEY_ENV]
        small = ["--max_turns", "2", "--tau", "0.99", "--batch_size", "1", "--group_size", "2"]
        small += ["--lora_r", "4", "--max_steps", "2", "--save_steps", "2", "--max_off_policy_steps", "1"]
        args = ["grpo", "--train_data", str(data), "--output_dir", str(out), *served, *judged, *small]
        assert cli.main(args) == 0, capsys.readouterr().err
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2]
    for m, role in itertools.product(metrics, ("policy", "judge")):
        assert 0.0 < m[f"server/{role}/prefix_cache_hit_rate"] < 1.0, m
        assert 0.0 <= m[f"server/{role}/kv_cache_usage"] <= 1.0
        # The fake serves one request at a time.
        assert m[f"server/{role}/running"] in (0.0, 1.0) and m[f"server/{role}/waiting"] >= 0.0
    # Beside the time the trainer waited for those rollouts.
    keys = list(metrics[0])
    assert keys.index("time/wait_rollouts_s") + 1 == keys.index("server/policy/prefix_cache_hit_rate")
