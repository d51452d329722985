"""Errors a user can act on. The CLI prints them without a traceback; library code never exits."""

import signal
from pathlib import Path


class UserError(Exception):
    """Bad input, configuration or environment: the message says what was wrong, where, and the fix."""


class LostPeers(UserError):
    """A collective failed because another process of the job is gone. The CLI prints it and leaves at
    once: NCCL's threads would hold up a normal exit (lm/processes.py)."""


class DataError(UserError):
    """A data file is malformed at a given line."""

    def __init__(self, path: str | Path, line: int, reason: str) -> None:
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{path}:{line}: {reason}")


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGTERM) raised as Ctrl-C's exception, so that one handler serves both."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_signal(stop: KeyboardInterrupt) -> signal.Signals:
    """The signal behind an interrupt: Ctrl-C's own KeyboardInterrupt is SIGINT."""
    return signal.Signals(getattr(stop, "signum", signal.SIGINT))
