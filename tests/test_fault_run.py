"""`emoji_rl.fault_run`'s own logic on synthetic run directories: what counts as the same outputs, and
the kill schedule. (The runs themselves are `make fault-run`'s, minutes each.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from emoji_rl import fault_run
from emoji_rl.fault_run import differences, kill_times

ROOT = Path(__file__).resolve().parents[1]
REPORT = "# Experiment report: {dir}\n\n## Systems\nrl 0.5\n\n## Stage timings\nsft 0.3 {when}\n\n## Caveat\nsmall\n"


def run_dir(path: Path, seconds: float, when: str, loss: float = 1.5) -> Path:
    """A finished run as the stages leave one: outputs naming their directory, timings, markers."""
    sft = {"step": 2, "train/loss": loss, "train/train_runtime": seconds, "train/train_samples_per_second": 1}
    files = {
        "data/prompts.jsonl": '{"text": "hi"}\n',
        "grpo/config.yaml": f"output_dir: {path}/grpo\n",
        "grpo/metrics.jsonl": json.dumps({"step": 1, "reward/mean": 0.5, "time/rollout_s": seconds}) + "\n",
        "sft/metrics.jsonl": json.dumps(sft) + "\n",
        "report.md": REPORT.format(dir=path, when=when),
        "reports/retrieval/retrieval_records.jsonl": f'{{"systems": {{"sft": "adapter sha256:{when.encode().hex()}"}}}}\n',
        "reports/retrieval/retrieval.json": '{"sft": {"similarity": 0.5}}\n',
        "pipeline.log": f"== pipeline [1/1] sft: done in {seconds} s\n",
        "stages/sft.done": json.dumps({"seconds": seconds, "finished": when}),
        "grpo/tensorboard/events.out.tfevents.1": when,
        "sft/checkpoint-1/trainer_state.json": when,
        "sft/adapter/training_args.bin": when,
    }
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    (path / "sft/adapter/adapter_model.safetensors").write_bytes(b"\x00\xff" + str(loss).encode())
    return path


def test_runs_that_differ_only_in_directory_timings_and_resume_state_are_the_same(tmp_path):
    whole = run_dir(tmp_path / "whole", 3.0, "17:00")
    killed = run_dir(tmp_path / "run-01", 9.5, "18:00")
    (killed / "sft/checkpoint-2").mkdir()
    (killed / "sft/checkpoint-2/trainer_state.json").write_text("left by the kill")
    assert differences(whole, killed) == []


def test_another_result_a_missing_and_an_extra_file_are_each_named(tmp_path):
    whole = run_dir(tmp_path / "whole", 3.0, "17:00")
    killed = run_dir(tmp_path / "run-01", 3.0, "17:00", loss=1.25)
    (killed / "data/prompts.jsonl").unlink()
    (killed / "data/prompts.jsonl.tmp").write_text("half")
    assert differences(whole, killed) == [
        "missing data/prompts.jsonl",
        "extra data/prompts.jsonl.tmp",
        "differs sft/adapter/adapter_model.safetensors",
        "differs sft/metrics.jsonl",
    ]


def test_a_changed_figure_in_the_report_is_caught_outside_the_timings_section(tmp_path):
    whole = run_dir(tmp_path / "whole", 3.0, "17:00")
    killed = run_dir(tmp_path / "run-01", 3.0, "17:00")
    report = killed / "report.md"
    report.write_text(report.read_text().replace("rl 0.5", "rl 0.6"))
    assert differences(whole, killed) == ["differs report.md"]


def test_kill_times_are_seeded_and_fall_inside_the_uninterrupted_run():
    times = kill_times(0, 20, 120.0)
    assert times == kill_times(0, 20, 120.0) != kill_times(1, 20, 120.0)
    assert len(times) == 20 and all(0 <= t < 120.0 for t in times)
    assert min(times) < 40 and max(times) > 80  # spread over the run, not bunched


@pytest.mark.parametrize("key", ["train/train_runtime", "time/judge_s", "throughput/tokens_per_s"])
def test_timing_keys_are_the_ones_dropped(key):
    assert fault_run.TIMING_KEY.search(key)
    assert not fault_run.TIMING_KEY.search("train/loss")


def test_the_fault_config_keeps_the_training_stages_resumable():
    stages = yaml.safe_load((ROOT / fault_run.CONFIG).read_text())["stages"]
    runs = {s["name"]: s["run"].split() for s in stages}
    for name in ("sft", "grpo"):
        assert runs[name][-2:] == ["--resume", "true"] and "--save_steps" in runs[name]
    assert list(runs)[-1] == "report"
