import json

import pytest
import torch

from emoji_rl import cli, models
from emoji_rl.eval import retrieval
from emoji_rl.rl.reward import Similarity


def test_systems_parse_and_reject_bad_specs():
    assert retrieval.parse_systems(["base", "sft=runs/sft/adapter"]) == {
        "base": None,
        "sft": "runs/sft/adapter",
    }
    with pytest.raises(ValueError, match="NAME=ADAPTER_DIR"):
        retrieval.parse_systems(["sft"])
    with pytest.raises(ValueError, match="appears twice"):
        retrieval.parse_systems(["a=x", "a=y"])


def test_retrieval_at_k_hand_checked(embedder):
    similarity = Similarity(embedder)
    targets = ["I love pizza", "the car broke down", "my cat is asleep", "we won the football match"]
    guesses = ["pizza is my favourite food", "engine trouble with the car", "the dog barks", "pizza"]
    # guesses 1 and 2 pick their own target; 3 (dog) may or may not; 4 (pizza) picks target 1, a miss.
    score = retrieval.retrieval_at_k(similarity, targets, guesses, k=4, seed=0)
    assert 0.5 <= score <= 0.75


@pytest.mark.slow
def test_eval_retrieval_compares_systems(tmp_path, capsys):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = models.load_causal_lm(models.SMOLLM2, models.pick_runtime("cpu"))
    adapter = get_peft_model(
        base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    adapter.save_pretrained(tmp_path / "adapter")
    data = tmp_path / "eval.jsonl"
    targets = [
        f"let's meet at the {place} at {hour} o'clock"
        for place, hour in zip(
            ["beach", "park", "cafe", "station", "museum", "gym"], range(1, 7), strict=True
        )
    ]
    data.write_text("".join(json.dumps({"id": str(i), "target": t}) + "\n" for i, t in enumerate(targets)))
    code = cli.main(
        [
            "eval-retrieval",
            "--systems",
            "base",
            f"noisy={tmp_path / 'adapter'}",
            "--data",
            str(data),
            "--judge",
            "lexicon",
            "--max_turns",
            "2",
            "--distractors",
            "4",
            "--max_new_tokens",
            "24",
            "--output_dir",
            str(tmp_path / "report"),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "report" / "retrieval.json").read_text())
    assert [(r["system"], r["mode"]) for r in report["rows"]] == [
        ("base", "single"),
        ("base", "multi"),
        ("noisy", "single"),
        ("noisy", "multi"),
    ]
    for row in report["rows"]:
        assert 0.0 <= row["success@0.65"] <= 1.0 and row["turns"] >= 1.0
        assert row["turns"] <= (1.0 if row["mode"] == "single" else 2.0)
    assert report["caveat"] and (tmp_path / "report" / "retrieval.png").stat().st_size > 0
    assert "retrieval@1/4" in capsys.readouterr().out


@pytest.mark.slow
def test_a_judge_server_that_is_not_there_is_said_at_once_and_fails_with_its_url_and_a_hint(tmp_path):
    import subprocess
    import sys
    import time

    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"target": "let's get pizza tonight"}) + "\n")
    wait_s = 4
    stage = [sys.executable, "-m", "emoji_rl.cli", "eval-retrieval", "--data", str(data)]
    stage += ["--output_dir", str(tmp_path / "out"), "--judge", "openai", "--judge_url", "http://127.0.0.1:9"]
    with subprocess.Popen([*stage, "--server_wait_s", str(wait_s)], stderr=subprocess.PIPE, text=True) as run:
        lines = [(time.monotonic(), line) for line in run.stderr]
    assert run.returncode == 2, lines
    said = [at for at, line in lines if "waiting for the judge server at http://127.0.0.1:9/health" in line]
    assert said, lines
    # Said when the wait began, not when it ended: the wait ran its whole length after it.
    ended, error = lines[-1]
    assert wait_s - 0.5 < ended - said[0] < wait_s + 5
    assert "http://127.0.0.1:9/health within 4 s" in error
    assert "make serve-judge" in error and "--dry-run" in error and "--server_wait_s" in error
