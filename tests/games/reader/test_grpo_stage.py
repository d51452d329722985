"""`emoji-rl grpo --game reader` end to end on the embedded SmolLM2: in-process, the sender a second copy
of the base model under the grammar; and on the fake vLLM server, the sender the policy server's base
asked through /v1/chat/completions with the grammar in the request."""

import json

import pytest
from tests.fakes.fake_lm import FakeLM
from tests.fakes.vllm_server import FakeVLLMServer
from tests.trackers import assert_mlflow_keeps_every_name

from emoji_rl import cli
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.constraint import vllm_structured_outputs
from emoji_rl.emoji.sender_prompts import SENDER_CORRECTION_TURN, sender_messages
from emoji_rl.io.metrics import read_metrics
from emoji_rl.lm import models

pytestmark = pytest.mark.slow

MESSAGES = {
    "Let's get pizza and watch a movie tonight": "🍕 🎬 🌃",
    "I am so tired after a long day at work": "😫 💼",
    "The train is late again": "🚆 ⏰",
}
KEY_ENV = "EMOJI_RL_TEST_POLICY_KEY"


@pytest.fixture
def split(tmp_path):
    """An SFT split as `emoji-rl teacher` writes it."""
    path = tmp_path / "sft_train.jsonl"
    records = [
        {"id": f"m{i}", "target": t, "messages": [*sender_messages(t), {"role": "assistant", "content": e}]}
        for i, (t, e) in enumerate(MESSAGES.items())
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


SMALL = {"batch_size": 1, "group_size": 2, "max_turns": 2, "tau": 0.99, "lora_r": 4, "max_new_tokens": 24}
SMALL |= {"contrast": 1, "contrast_messages": 2, "per_device_train_batch_size": 4}


def grpo(split, out, *extra):
    args = ["--game", "reader", "--train_data", split, "--output_dir", str(out)]
    args += [word for name, value in SMALL.items() for word in (f"--{name}", str(value))]
    assert cli.main(["grpo", *args, *extra]) == 0
    episodes = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    return read_metrics(out), episodes


def test_the_reader_trains_from_the_command_line_with_the_sender_in_process(split, tmp_path):
    # The held-out evaluation reads the SFT split the game's way (the teacher's emoji from `messages`).
    held_out = ("--eval_data", split, "--eval_before_train", "true", "--eval_max_examples", "2")
    metrics, episodes = grpo(split, tmp_path / "run", "--max_steps", "2", "--save_steps", "2", *held_out)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert 0 <= metrics[0]["eval/similarity"] <= 1 and metrics[0]["eval/turns"] >= 1
    keys = {"game/similarity", "game/first_similarity", "reward/contrast/mean", "time/partner_s"}
    assert all(keys <= m.keys() for m in metrics[1:])
    assert {e["target"] for e in episodes} <= MESSAGES.keys() and len(episodes) == 4
    for episode in episodes:
        first = episode["turns"][0]
        assert first["emoji"] == MESSAGES[episode["target"]] and first["guess"]
        # The frozen base sender answered the guess under the grammar: a valid emoji message.
        assert all(parse_message(t["emoji"]).ok for t in episode["turns"][1:])
        assert abs(episode["reward"] - episode["turns"][-1]["reward/total"]) < 1e-6
    assert any(len(e["turns"]) == 2 for e in episodes)
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()
    assert "game: reader" in (tmp_path / "run" / "config.yaml").read_text()
    assert_mlflow_keeps_every_name(tmp_path / "run")


def test_the_sender_can_be_the_policy_servers_base_one_version_behind(split, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    with FakeVLLMServer(
        FakeLM(models.load_tokenizer(models.SMOLLM2)), logprobs_mode="processed_logprobs"
    ) as fake:
        served = ["--engine", "vllm", "--vllm_url", fake.url, "--vllm_api_key_env", KEY_ENV]
        metrics, episodes = grpo(
            split,
            tmp_path / "run",
            *served,
            *["--partner", "openai", "--partner_api_key_env", KEY_ENV, "--max_off_policy_steps", "1"],
            *["--max_steps", "1", "--save_steps", "1"],
        )
        chats, completions = fake.bodies("/v1/chat/completions"), fake.bodies("/v1/completions")
    assert [m["step"] for m in metrics] == [1] and metrics[0]["async/version_lag"] == 0.0
    # The reader's turns are free text; the sender's are the base's (the served name), under the grammar.
    assert completions and not any("structured_outputs" in body for body in completions)
    assert chats and all(body["model"] == "policy" for body in chats)
    assert all(body["structured_outputs"] == vllm_structured_outputs(2, 8) for body in chats)
    head, _, _ = SENDER_CORRECTION_TURN.partition("{guess}")
    assert all(body["messages"][-1]["content"].startswith(head) for body in chats)
    assert len(chats) == sum(
        len(e["turns"]) > 1 or e["turns"][0].get("partner_failed") == 1.0 for e in episodes
    )
    assert_mlflow_keeps_every_name(tmp_path / "run")  # with the servers' own metrics (server/)
