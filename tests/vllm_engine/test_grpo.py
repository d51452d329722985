"""GRPO with `--engine vllm` and `--judge openai` against the real engine: steps, a resume, and a
rerun into the same run directory, each sampled by the adapter the trainer just published and never
served from a prefix cached under an earlier session's adapter (docs/VLLM.md §4)."""

from __future__ import annotations

import shutil

import pytest
from tests.vllm_engine.conftest import KEY_ENV

from emoji_rl import cli
from emoji_rl.io.metrics import read_metrics

pytestmark = pytest.mark.vllm_engine

# The sampler's log-probs against the trainer's own, as a mean log-ratio over the step's tokens:
# about 1e-7 in fp32 when both score the same weights; stale prefixes gave 0.4 and 0.9.
KL_TOLERANCE = 1e-3


def grpo(engine, out, *extra: str) -> int:
    return cli.main(
        [
            "grpo",
            "--train_data", "data/samples/rl_eval.jsonl",
            "--output_dir", str(out),
            "--batch_size", "2",
            "--group_size", "4",
            "--max_turns", "1",
            "--lora_r", "8",
            "--learning_rate", "5e-3",
            "--temperature", "0.7",
            "--save_steps", "1",
            "--engine", "vllm",
            "--vllm_url", engine.url,
            "--vllm_api_key_env", KEY_ENV,
            "--judge", "openai",
            "--judge_url", engine.url,
            "--judge_model", "judge",
            "--judge_api_key_env", KEY_ENV,
            "--judge_view", "gloss",
            "--judge_temperature", "0",
            *extra,
        ]
    )  # fmt: skip


def sampler_kl(out) -> dict[int, float]:
    return {m["step"]: m["sampler/kl_vs_trainer"] for m in read_metrics(out) if "sampler/kl_vs_trainer" in m}


def test_grpo_trains_resumes_and_reruns_against_the_engine(engine, engine_key, tmp_path, capsys):
    out = tmp_path / "run"
    assert grpo(engine, out, "--max_steps", "1", "--seed", "0") == 0, capsys.readouterr().err
    first = sampler_kl(out)
    assert sorted(first) == [1] and abs(first[1]) < KL_TOLERANCE, read_metrics(out)

    # A resume goes on from the checkpoint, under a session of its own: step 2 is sampled by step 1's
    # adapter, loaded again from the checkpoint.
    resumed = grpo(engine, out, "--max_steps", "2", "--seed", "0", "--resume", "true")
    assert resumed == 0, capsys.readouterr().err
    resumed = sampler_kl(out)
    assert sorted(resumed) == [1, 2] and abs(resumed[2]) < KL_TOLERANCE, resumed

    # The run deleted and started again in the same place, with other weights from step 1 on: the same
    # steps, the same folder, and (before sessions) the same adapter names and paths, whose prefixes
    # the server still held. Its names and paths are its own: nothing cached is served to it.
    shutil.rmtree(out)
    assert grpo(engine, out, "--max_steps", "2", "--seed", "1") == 0, capsys.readouterr().err
    rerun = sampler_kl(out)
    assert sorted(rerun) == [1, 2], rerun
    assert all(abs(kl) < KL_TOLERANCE for kl in rerun.values()), rerun
