"""Put on PYTHONPATH by tests/test_two_nodes.py: every process a launcher starts (torchrun and
accelerate export RANK to them, never to themselves) records what it writes, creates, renames or
removes under EMOJI_RL_AUDIT_ROOT, one JSON line per event in EMOJI_RL_AUDIT_ROOT/../audit-RANK-PID,
so that the test can tell which process wrote each file of a run that several nodes share.

Python's audit hooks see every file the interpreter opens (builtins.open, os.open: JSON, torch.save,
TensorBoard) and every os.mkdir, os.rename/replace, os.remove and shutil.rmtree; not the bytes a
native library writes to a file it opened itself (safetensors, torch.save's zip writer), whose
directory they still see made and renamed."""

import json
import os
import sys

_ROOT = os.environ.get("EMOJI_RL_AUDIT_ROOT")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _install(root: str, rank: str) -> None:
    log = open(os.path.join(os.path.dirname(root), f"audit-{rank}-{os.getpid()}"), "a", buffering=1)  # noqa: SIM115

    def record(event: str, path: object) -> None:
        if isinstance(path, (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(path))
            if path.startswith(root + os.sep):
                log.write(
                    json.dumps({"rank": int(rank), "event": event, "path": path[len(root) + 1 :]}) + "\n"
                )

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if (isinstance(mode, str) and set(mode) & set("wax+")) or (flags or 0) & _WRITE_FLAGS:
                record(event, path)
        elif event in ("os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree"):
            record(event, args[0])
        elif event == "os.rename":
            record(event, args[0])
            record(event, args[1])

    sys.addaudithook(hook)


if _ROOT and "RANK" in os.environ:
    _install(os.path.abspath(_ROOT), os.environ["RANK"])
