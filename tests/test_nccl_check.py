"""launch/gpu_nccl_check.sh and emoji_rl.selftest.nccl_check, for the next GPU (issue 59, point 5): what
can be checked without one. The settings each variant runs under, the verdicts the GPU's figures get,
the command the script runs, and a clear refusal without CUDA."""

from __future__ import annotations

import shlex

import pytest
from tests.test_launch import run, split_env

from emoji_rl.lm.processes import NCCL_ENV
from emoji_rl.selftest import nccl_check
from emoji_rl.selftest.nccl_check import Measured, variant_env, verdict


def test_ours_is_the_stages_own_settings_and_dump_is_torchs_default_dump():
    assert (
        variant_env("ours", 60)
        == NCCL_ENV
        == {
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        }
    )
    dump = variant_env("dump", 60)
    assert dump["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2" and dump["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert dump["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "60" and int(dump["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0


@pytest.mark.parametrize(
    ("variant", "measured", "passed", "says"),
    [
        (
            "ours",
            Measured(71.0, 1.5, 1),
            True,
            "the error after 71 s (expected about 70 s), the exit 2 s after it",
        ),
        ("ours", Measured(71.0, 62.0, 1), False, "expected within 15 s"),
        ("ours", Measured(None, None, None), False, "no error reached Python (expected at about 70 s)"),
        ("ours", Measured(130.0, 1.0, 1), False, "later than the watchdog's pause explains"),
        ("dump", Measured(72.0, 61.0, 1), True, "the exit 61 s after it"),
        ("dump", Measured(72.0, 3.0, -6), True, "returncode -6"),
        ("dump", Measured(72.0, 2.0, 1), False, "expected held about 60 s (the monitor's sleep) or SIGABRT"),
        ("dump", Measured(72.0, None, None), False, "then the process never ended"),
    ],
)
def test_the_verdict_reads_the_figures_as_torchs_code_predicts(variant, measured, passed, says):
    ok, text = verdict(variant, measured, timeout_s=10, heartbeat_s=60)
    assert ok is passed and says in text, text


def test_the_script_runs_the_check_on_one_gpu():
    result = run("gpu_nccl_check.sh", "--dry-run", "--variants", "ours", NCCL_CHECK_GPU="3")
    assert result.returncode == 0, result.stderr
    env, cmd = split_env(shlex.split(result.stdout))
    assert env == {"CUDA_VISIBLE_DEVICES": "3"}
    assert cmd[1:] == ["-m", "emoji_rl.selftest.nccl_check", "--variants", "ours"]
    with pytest.raises(SystemExit) as shown:
        nccl_check.main(["--help"])
    assert shown.value.code == 0
    assert "Settings (environment, default):" in run("gpu_nccl_check.sh", "--help").stdout


def test_without_cuda_a_variant_says_it_needs_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the check itself (launch/gpu_nccl_check.sh)")
    assert nccl_check.child(timeout_s=10) == 2
    assert "nccl_check: needs a CUDA GPU (NCCL)" in capsys.readouterr().err
