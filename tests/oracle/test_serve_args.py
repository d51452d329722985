"""Every `vllm serve` command the launch scripts print under --dry-run parses with vLLM 0.33's own
`vllm serve` parser and passes the checks it runs before loading a model: for each documented GPU
layout (GPUS=2|4|8) and for every example in the scripts' headers."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from tests.test_launch import ROOT, run

from emoji_rl.rl.rollout.vllm import LOGPROBS_MODE

SCRIPTS = ("serve_judge.sh", "serve_policy.sh", "gpu_smoke.sh")
# vLLM servers each script starts in each documented layout (GPUS). The 2-GPU layout has no policy
# server: serve_policy.sh refuses it (tests/test_launch.py checks that) and gpu_smoke.sh starts only
# the judge. A script never passes here by printing nothing.
SERVERS = {
    0: {"serve_judge.sh": 1, "serve_policy.sh": 1, "gpu_smoke.sh": 2},
    2: {"serve_judge.sh": 1, "gpu_smoke.sh": 1},
    4: {"serve_judge.sh": 1, "serve_policy.sh": 1, "gpu_smoke.sh": 2},
    8: {"serve_judge.sh": 1, "serve_policy.sh": 1, "gpu_smoke.sh": 2},
}
# The headers' examples are read as on a 4-GPU box, unless they set GPUS themselves (GPUS=0: the CPU
# layout). The interpreter is the suite's: the CPU layout resolves the embedded model's directory with it.
HEADER_BOX = {"GPUS": "4", "PYTHON": sys.executable}
# The policy server's size for asynchronous GRPO (MAX_OFF_POLICY_STEPS, K; unset: 1): lockstep and a
# lag of several updates, on each layout with a policy server.
OFF_POLICY_STEPS = ("0", "3")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def header_examples(script: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment, arguments) of each `#   [VAR=value ...] launch/SCRIPT [args]` line of the header."""
    # The shebang is a comment line too.
    example = re.compile(rf"#\s+([A-Za-z_]\w*=\S*\s+)*launch/{re.escape(script)}(\s|$)")
    examples = []
    for line in (ROOT / "launch" / script).read_text().splitlines():
        if not line.startswith("#"):
            break  # the header is the comment block at the top
        if not example.match(line):
            continue
        words = shlex.split(line[1:], comments=True)
        at = words.index(f"launch/{script}")
        env = dict(word.split("=", 1) for word in words[:at] if ASSIGNMENT.match(word))
        examples.append((env, [w for w in words[at + 1 :] if w != "--dry-run"]))
    return examples


CASES = (
    [
        pytest.param(script, {"GPUS": str(gpus), "PYTHON": sys.executable}, [], id=f"{script}-GPUS={gpus}")
        for gpus, scripts in SERVERS.items()
        for script in scripts
    ]
    + [
        pytest.param(
            script,
            {"GPUS": str(gpus), "PYTHON": sys.executable, "MAX_OFF_POLICY_STEPS": k},
            [],
            id=f"{script}-GPUS={gpus}-K={k}",
        )
        for gpus, scripts in SERVERS.items()
        if "serve_policy.sh" in scripts
        for script in ("serve_policy.sh", "gpu_smoke.sh")
        for k in OFF_POLICY_STEPS
    ]
    + [
        pytest.param(script, HEADER_BOX | env, args, id=f"{script}-header-{i}")
        for script in SCRIPTS
        for i, (env, args) in enumerate(header_examples(script))
    ]
)


def vllm_serve_argvs(stdout: str) -> list[list[str]]:
    """The arguments after the vllm executable of each printed `vllm serve` command, whatever
    `env VAR=...` precedes it and wherever the executable lives (vllm, .venv-vllm/bin/vllm)."""
    argvs = []
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        words = shlex.split(line)
        for at, word in enumerate(words[:-1]):
            if Path(word).name == "vllm" and words[at + 1] == "serve":
                assert all(w == "env" or ASSIGNMENT.match(w) for w in words[:at]), line
                argvs.append(words[at + 1 :])
                break
    return argvs


@pytest.fixture(scope="module")
def parsed(vllm_oracle):
    """Every case's commands, parsed in one batch (one pass through vLLM's parser per command)."""
    commands = {}
    for case in CASES:
        script, env, args = case.values
        result = run(script, "--dry-run", *args, **env)
        assert result.returncode == 0, (case.id, result.stderr)
        commands[case.id] = vllm_serve_argvs(result.stdout)
    flat = [argv for argvs in commands.values() for argv in argvs]
    answers = iter(vllm_oracle("serve", argvs=flat))
    return {case_id: [(argv, next(answers)) for argv in argvs] for case_id, argvs in commands.items()}


def test_there_are_header_examples_for_each_script():
    assert all(header_examples(script) for script in SCRIPTS)


@pytest.mark.parametrize(("script", "env", "args"), CASES)
def test_each_printed_vllm_serve_command_parses_with_vllms_parser(parsed, request, script, env, args):
    commands = parsed[request.node.callspec.id]
    assert len(commands) == SERVERS[int(env["GPUS"])][script], commands
    for argv, answer in commands:
        assert answer["error"] is None, (shlex.join(argv), answer["error"])
        parsed_args = answer["args"]
        assert parsed_args["generation_config"] == "vllm"
        if parsed_args["enable_lora"]:  # the policy server: what the rollout engine needs of it
            assert parsed_args["logprobs_mode"] == LOGPROBS_MODE
            assert parsed_args["structured_outputs_backend"] == "xgrammar"
            # An adapter version per update the rollouts may lag, and vLLM's LoRAConfig check (which
            # `vllm serve`'s validate does not run): the CPU cache holds at least a batch's adapters.
            in_use = int(env.get("MAX_OFF_POLICY_STEPS", "1")) + 1
            assert parsed_args["max_loras"] >= in_use
            assert parsed_args["max_cpu_loras"] >= parsed_args["max_loras"]
            # Qwen3.5's prefix-cache hits finer than its blocks on GPUs; none on the CPU engine,
            # where a split prefill fails a seeded rollout (docs/VLLM.md §9).
            assert parsed_args["prefix_match_unit"] == (None if env["GPUS"] == "0" else 16)


def test_the_executable_may_live_in_a_venv_and_unknown_flags_are_refused(vllm_oracle):
    result = run("serve_policy.sh", "--dry-run", "--no-such-flag", VLLM=".venv-vllm/bin/vllm", **HEADER_BOX)
    [argv] = vllm_serve_argvs(result.stdout)
    [answer] = vllm_oracle("serve", argvs=[argv])
    assert answer["error"] == ["contract.py: error: unrecognized arguments: --no-such-flag"]
