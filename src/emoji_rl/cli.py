"""`emoji-rl STAGE [--config FILE.yaml] [--field value ...]`: one entry point for every stage.

Each stage is a module with a `Config` dataclass (or `config_for(argv)`, where the game a command line
names decides the fields) and `main(cfg)`. Modules are imported only when their stage runs, so
`emoji-rl --help` answers without loading torch. An alias is a stage with some flags fixed
(`eval-wordle` is `eval --game wordle`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from emoji_rl.config import parse_config
from emoji_rl.errors import LostPeers, UserError, stop_signal
from emoji_rl.io.run_lock import run_lock

# stage -> (module, one-line description). Order is the pipeline's order.
STAGES: dict[str, tuple[str, str]] = {
    "prompts": ("emoji_rl.data.prompts", "natural-language messages: chitchat corpus (offline) or Claude"),
    "teacher": (
        "emoji_rl.data.teacher",
        "emoji answers (offline, Claude batches, OpenAI-compatible) -> SFT split",
    ),
    "judge-check": (
        "emoji_rl.eval.judge_check",
        "does the judge tell teacher emoji from random emoji? (similarity gap)",
    ),
    "reward-check": (
        "emoji_rl.eval.reward_check",
        "is GRPO's reward signal above the judge's noise? (spread inside groups vs re-reading)",
    ),
    "sft": ("emoji_rl.sft.train", "LoRA SFT of the sender on (message, emoji) chats (TRL + PEFT)"),
    "eval-sft": ("emoji_rl.sft.evaluate", "base vs SFT: format compliance and emoji stats, table/JSON/PNG"),
    "rl-prompts": (
        "emoji_rl.data.rl_prompts",
        "RL targets kept by a round trip (SFT sender -> judge) -> train/eval",
    ),
    "grpo": (
        "emoji_rl.rl.train",
        "multi-turn GRPO of a LoRA policy on a game (--game: retrieval, wordle, ...)",
    ),
    "debug-rollout": ("emoji_rl.rl.debug_rollout", "pretty-print logged GRPO episodes"),
    "play-game": ("emoji_rl.play_game", "play the retrieval game against the model, as sender or judge"),
    "eval": (
        "emoji_rl.play.evaluate",
        "any game on held-out records (--game NAME): systems side by side, paired intervals: table, JSON, PNG",
    ),
    "eval-retrieval": (
        "emoji_rl.play.evaluate",
        "eval --game retrieval: base vs SFT vs RL (vs teacher, random) on held-out targets",
    ),
    "experiment-report": (
        "emoji_rl.eval.experiment_report",
        "one run directory's evaluation, curves, examples and timings as report.md + PNGs",
    ),
    "play-web": ("emoji_rl.web.app", "people play the retrieval game in a browser (the human evaluation)"),
    "eval-human": ("emoji_rl.eval.human", "what people played in play-web: per sender, with 95% intervals"),
    "wordle-data": (
        "emoji_rl.games.wordle.data",
        "Wordle SFT traces from the entropy solver + RL answer splits",
    ),
    "eval-wordle": (
        "emoji_rl.play.evaluate",
        "eval --game wordle: base vs SFT vs RL (vs the entropy solver) on held-out answers",
    ),
    "eval-reader": (
        "emoji_rl.play.evaluate",
        "eval --game reader: the reader's seat, base vs RL readers on held-out messages",
    ),
    "chat": ("emoji_rl.chat", "talk to a model; emoji-constrained by default"),
    "pipeline": ("emoji_rl.pipeline", "run a list of stages in order, resumable (configs/*/experiment.yaml)"),
    "selftest": (
        "emoji_rl.selftest",
        "does this machine's stack run the device paths? random models at Qwen3.5-4B's shapes, PASS/FAIL table",
    ),
}


ALIASES: dict[str, tuple[str, ...]] = {
    "eval-retrieval": ("--game", "retrieval"),
    "eval-wordle": ("--game", "wordle"),
    "eval-reader": ("--game", "reader"),
}
"""The flags an alias fixes: its stage's other flags and YAML work as the stage's."""


def stage_argv(stage: str, argv: list[str]) -> list[str]:
    """A stage's command line with the flags its alias fixes in front."""
    fixed = ALIASES.get(stage, ())
    named = [arg for arg in argv if arg.split("=", 1)[0] in fixed[::2]]
    if named:
        raise UserError(
            f"{stage} is `eval {' '.join(fixed)}`: leave out {named[0]}, or run `emoji-rl eval` with it"
        )
    return [*fixed, *argv]


def config_class(module: object, argv: list[str]) -> type:
    """A stage's Config: its module's `Config`, or the one its `config_for(argv)` picks (grpo's depends
    on the game the command line names)."""
    pick = getattr(module, "config_for", None)
    return pick(argv) if pick is not None else module.Config  # type: ignore[attr-defined]


def _usage() -> str:
    width = max(map(len, STAGES))
    lines = [f"  {name:<{width}}  {desc}" for name, (_, desc) in STAGES.items()]
    return (
        "usage: emoji-rl STAGE [--config FILE.yaml] [--field value ...]\n\n"
        "stages:\n" + "\n".join(lines) + "\n\n`emoji-rl STAGE --help` lists a stage's fields."
    )


def process_rank(environ: Mapping[str, str]) -> int:
    """This process's global rank: `accelerate launch` and torchrun set RANK in every process they
    start, over all nodes; a process started alone is the main one."""
    return int(environ.get("RANK", "0"))


def logging_options(environ: Mapping[str, str]) -> dict[str, object]:
    """Under `accelerate launch` or torchrun every process runs the stage: info from the main
    process only, so each line shows once; warnings from every process, tagged with its rank."""
    rank = process_rank(environ)
    tag = f"[rank {rank}] " if rank else ""
    return {
        "level": logging.INFO if rank == 0 else logging.WARNING,
        "format": f"%(asctime)s {tag}%(name)s: %(message)s",
        "datefmt": "%H:%M:%S",
    }


HTTP_CLIENT_LOGGERS = ("httpx", "httpcore")


def quiet_http_clients() -> None:
    """The HTTP clients' own lines only from warnings up: httpx logs every request at info, one line per
    rollout request on the server path (177 of 199 lines of a 5-step run), burying the progress bar.
    Our clients say what matters themselves: a retry, a server down, the request that failed."""
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


# Writing output failed for a reason of the machine's, not a bug: one line, no traceback.
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES})
OUTPUT_KEYS = ("output_dir", "run_dir")
"""The config fields that name where a stage writes: checked before the stage starts."""


def output_dirs(cfg: object) -> Iterator[tuple[str, str]]:
    """(key, directory) for each output directory `cfg` names; none for a dry run, which writes nothing."""
    if getattr(cfg, "dry_run", False):
        return
    for key in OUTPUT_KEYS:
        value = getattr(cfg, key, None)
        if isinstance(value, str) and value:
            yield key, value


def check_writable(cfg: object) -> None:
    """Each output directory of `cfg` is, or can be made, one this process writes into, so that a
    stage does not work for minutes and then lose it all to a path that is a file or read-only.
    Nothing is created: a stage that fails its own checks leaves no directory behind."""
    for key, value in output_dirs(cfg):
        existing = Path(value)
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise UserError(f"{key}={value}: {existing} is a file, where a directory is needed")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UserError(
                f"{key}={value}: {existing} cannot be written to (read-only?); choose another --{key}"
            )


INPUT = "input"
"""The metadata key of a config field that names a file or directory the stage reads (`"input": True`),
or a list of them as NAME=PATH entries (an evaluation's systems): checked before the stage starts, and
so before any model loads."""


def missing_inputs(cfg: object, root: Path = Path()) -> list[str]:
    """`key=value (what it is)` for each input of `cfg` (fields marked INPUT) that does not exist,
    relative paths taken from `root`."""
    missing = []
    for field in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, field.name)
        if not field.metadata.get(INPUT):
            continue
        paths = [value] if isinstance(value, str) else [v.split("=", 1)[1] for v in value or () if "=" in v]
        for path in paths:
            if path and not (root / path).exists():
                shown = value if isinstance(value, str) else next(v for v in value if v.endswith(f"={path}"))
                missing.append(f"{field.name}={shown} ({field.metadata.get('help', 'an input')})")
    return missing


def check_inputs(cfg: object) -> None:
    """Every file and directory `cfg` reads exists: a stage that would load a model for minutes and
    then stop on a missing --train_data stops here instead, naming the key."""
    if missing := missing_inputs(cfg):
        raise UserError(
            f"no such file or directory: {'; '.join(missing)}. The stage that writes it runs first: "
            "`make experiment` runs every stage in order from nothing (docs/gpu/README.md, Step by step)"
        )


@contextlib.contextmanager
def one_run_per_directory(cfg: object, environ: Mapping[str, str]) -> Iterator[None]:
    """Each output directory of `cfg` locked for this run (io/run_lock.py), so that two runs on one
    directory do not both write it: the second is refused at once, naming the PID of the first. Under
    `accelerate launch` or torchrun the ranks share the directory and the global main process holds it
    for them all."""
    with contextlib.ExitStack() as locks:
        if process_rank(environ) == 0:
            for key, value in output_dirs(cfg):
                locks.enter_context(run_lock(Path(value), f"{key}={value}"))
        yield


def leave(status: int) -> None:
    """End the process now, its output flushed: what it had to save is saved (the trackers and the
    run lock were closed as the error left the stage), and NCCL's threads, waiting out a dead peer,
    would hold up an interpreter's exit for minutes."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    stage, rest = argv[0], argv[1:]
    if stage not in STAGES:
        print(f"emoji-rl: unknown stage {stage!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    logging.basicConfig(**logging_options(os.environ))
    quiet_http_clients()
    try:
        module = importlib.import_module(STAGES[stage][0])
        rest = stage_argv(stage, rest)
        cfg = parse_config(config_class(module, rest), rest, prog=f"emoji-rl {stage}")
        check_writable(cfg)
        check_inputs(cfg)
        with one_run_per_directory(cfg, os.environ):
            if hasattr(cfg, "wait_for_judge"):  # the stages that ask a judge (`JudgeConfig`)
                cfg.wait_for_judge()
            status = module.main(cfg)  # None, or an exit status (selftest: 1 when a check failed)
    except UserError as err:
        print(f"emoji-rl {stage}: error: {err}", file=sys.stderr)
        if isinstance(err, LostPeers):
            leave(2)
        return 2
    except OSError as err:
        if err.errno not in _OUTPUT_ERRNOS:
            raise
        where = f" ({err.filename})" if err.filename else ""
        print(
            f"emoji-rl {stage}: error: {err.strerror}{where}; what was written before stays, and the stages "
            "that resume (teacher, sft, grpo, eval, pipeline) go on from it when rerun",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM where a stage turns it into one (pipeline)
        signum = stop_signal(stop)
        print(f"emoji-rl {stage}: interrupted ({signum.name})", file=sys.stderr)
        return 128 + signum
    return status or 0


if __name__ == "__main__":
    raise SystemExit(main())
