"""Errors a user can act on. The CLI prints them without a traceback; library code never exits."""

from pathlib import Path


class UserError(Exception):
    """Bad input, configuration or environment: the message says what was wrong, where, and the fix."""


class DataError(UserError):
    """A data file is malformed at a given line."""

    def __init__(self, path: str | Path, line: int, reason: str) -> None:
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{path}:{line}: {reason}")
