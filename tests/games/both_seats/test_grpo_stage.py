"""`emoji-rl grpo --game both_seats` and `emoji-rl eval --game both_seats` end to end on the embedded SmolLM2 with the
lexicon judge: in process with the held-out evaluation, and one version behind the fake vLLM server,
whose one adapter per version plays both seats (the gpu profile's shape: configs/gpu/grpo.both.yaml)."""

import json

import pytest
from tests.fakes.fake_lm import FakeLM
from tests.fakes.vllm_server import FakeVLLMServer
from tests.trackers import assert_mlflow_keeps_every_name

from emoji_rl import cli
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.eval import seats_report
from emoji_rl.io.metrics import read_metrics
from emoji_rl.lm import models

pytestmark = pytest.mark.slow

MESSAGES = {
    "Let's get pizza and watch a movie tonight": "🍕 🎬 🌃",
    "I am so tired after a long day at work": "😫 💼",
    "The train is late again": "🚆 ⏰",
    "We should go to the beach this weekend": "🏖️ 🌞",
}
KEY_ENV = "EMOJI_RL_TEST_POLICY_KEY"


@pytest.fixture
def data(tmp_path):
    """rl-prompts' records (a target each), and an SFT split holding the teacher's emoji for them."""
    records, split = tmp_path / "rl_train.jsonl", tmp_path / "sft_train.jsonl"
    records.write_text(
        "".join(json.dumps({"id": f"m{i}", "target": t}) + "\n" for i, t in enumerate(MESSAGES))
    )
    split.write_text(
        "".join(
            json.dumps({"target": t, "messages": [*sender_messages(t), {"role": "assistant", "content": e}]})
            + "\n"
            for t, e in MESSAGES.items()
        )
    )
    return str(records), str(split)


# Up to 3 emoji in 32 tokens: the fresh adapter's messages end within the budget, so the judge reads them.
SMALL = {"batch_size": 1, "group_size": 2, "max_turns": 1, "lora_r": 4, "max_new_tokens": 32, "beta": 0}
SMALL |= {"max_emoji": 3}
SMALL |= {"judge": "lexicon", "teacher_share": 0.5, "per_device_train_batch_size": 8}


def grpo(data, out, *extra):
    records, split = data
    args = ["--game", "both_seats", "--train_data", records, "--teacher_data", split]
    args += ["--output_dir", str(out)]
    args += [word for name, value in SMALL.items() for word in (f"--{name}", str(value))]
    assert cli.main(["grpo", *args, *extra]) == 0
    episodes = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    return read_metrics(out), episodes


def test_both_seats_train_in_process_and_evaluate(data, tmp_path):
    held_out = ("--eval_data", data[0], "--eval_steps", "1")
    held_out += ("--eval_max_examples", "2")
    metrics, episodes = grpo(data, tmp_path / "run", "--max_steps", "1", "--save_steps", "1", *held_out)
    assert [m["step"] for m in metrics] == [1]
    for line in metrics:  # the held-out evaluation: both seats' rewards, every reading
        assert {
            "eval/reward/sender/mean",
            "eval/reward/reader/mean",
            "eval/judge_similarity",
            "eval/drift",
        } <= line.keys()
        assert "eval/teacher_similarity" in line and "eval/pair_similarity" in line
    keys = {"reward/sender/mean", "reward/reader/mean", "group/reader/frac_zero_std", "game/judge_similarity"}
    assert keys <= metrics[0].keys() and "reward/mean" not in metrics[0]
    assert_mlflow_keeps_every_name(tmp_path / "run")  # each seat's names, the evaluation's beside them
    assert sorted(e["seat"] for e in episodes) == ["reader"] * 2 + ["sender"] * 2
    assert all(len(e["turns"]) == 1 for e in episodes)  # each record its seat's turns
    adapter = tmp_path / "run" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()

    report = tmp_path / "run" / "reports" / "both"
    args = ["eval", "--game", "both_seats", "--data", data[0], "--teacher_data", data[1]]
    args += ["--judge", "lexicon", "--max_turns", "1"]
    args += ["--systems", "base", f"both={adapter}", "--max_new_tokens", "32", "--max_emoji", "3"]
    args += ["--max_examples", "2", "--output_dir", str(report)]
    assert cli.main(args) == 0
    evaluated = json.loads((report / "both_seats.json").read_text())
    rows = {(r["system"], r["mode"]): r for r in evaluated["rows"]}
    assert set(rows) == {(s, m) for s in ("base", "both") for m in ("pair", "teacher")}
    assert "drift_lo" in rows["both", "pair"] and "drift" not in rows["both", "teacher"]
    assert {(c["a"], c["b"], c["metric"]) for c in evaluated["comparisons"]} >= {
        ("both", "base", "judge_similarity"),
        ("both", "base", "reader_similarity"),
    }
    # experiment-report on it: the questions this evaluation can answer (no sender alone here), and the
    # system trained in both seats found by the config.yaml beside its adapter (judge_weight 0.75).
    assert evaluated["systems"] == {"base": "base", "both": str(adapter)}
    assert seats_report.reader_weights(evaluated) == {"both": 0.25}
    assert cli.main(["experiment-report", "--run_dir", str(tmp_path / "run")]) == 0
    lines = (tmp_path / "run" / "report.md").read_text().splitlines()
    assert any(line.startswith("| (a) ") and line.endswith("n/a: not evaluated |") for line in lines)
    assert any(line.startswith("| (c) ") and "| 2 |" in line for line in lines)


def test_one_adapter_on_the_server_plays_both_seats_one_version_behind(data, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    with FakeVLLMServer(
        FakeLM(models.load_tokenizer(models.SMOLLM2)), logprobs_mode="processed_logprobs"
    ) as fake:
        served = ["--engine", "vllm", "--vllm_url", fake.url, "--vllm_api_key_env", KEY_ENV]
        metrics, _ = grpo(data, tmp_path / "run", *served, "--max_off_policy_steps", "1", "--max_steps", "2")
        bodies = fake.bodies("/v1/completions")
    assert [m["async/version_lag"] for m in metrics] == [0.0, 1.0]
    # Both steps' episodes were played before the first update landed (one version behind), by the one
    # adapter v0: it wrote the emoji (the grammar in the request) and read them (none).
    kinds = {(body["model"].rsplit("-", 1)[-1], "structured_outputs" in body) for body in bodies}
    assert kinds == {("v0", True), ("v0", False)}
    assert len({body["seed"] for body in bodies}) == len(bodies)
