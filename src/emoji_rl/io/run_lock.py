"""One run per directory: a stage's exclusive lock on the directory it writes.

The lock is `flock` on `DIR/.lock`, which holds the PID and host of its holder. The kernel releases it
when the holder exits, however it exits (kill -9 included), so a lock file left behind by a killed run
is only a file: the next run or resume takes the lock on it. `flock` works across the nodes of a
shared filesystem where the filesystem supports it (NFSv4 does; Lustre needs `-o flock`).

A process that holds a directory's lock names it in $EMOJI_RL_LOCKED_DIRS, which its children inherit:
a stage run under a holder (the pipeline's `experiment-report --run_dir {run_dir}`) writes into the
directory its parent holds for it, rather than being refused by its own parent.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from emoji_rl.errors import UserError

LOCK_FILE = ".lock"
HELD_ENV = "EMOJI_RL_LOCKED_DIRS"
# How long a refused run waits for the holder to write its PID (it writes right after locking).
_PID_WAIT_S = 1.0


def _holder(fd: int) -> str:
    deadline = time.monotonic() + _PID_WAIT_S
    while not (text := os.pread(fd, 256, 0).decode(errors="replace").split()) and time.monotonic() < deadline:
        time.sleep(0.02)
    if not text:
        return "a process that has not written its PID yet"
    # What the file holds is shown, not trusted: another program's bytes (NUL, escapes) stay off the terminal.
    pid, host = (_printable(word) for word in (text[0], text[1] if len(text) > 1 else "?"))
    return f"PID {pid}" if host == socket.gethostname() else f"PID {pid} on host {host}"


def _printable(word: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in word[:64])


def _open(path: Path, what: str) -> int:
    """The lock file, never through a link: as root, following one would truncate whatever it names."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UserError(f"{what}: {path} is a symbolic link, not a lock file; remove it") from None
        if err.errno == errno.EISDIR:
            raise UserError(f"{what}: {path} is a directory, not a lock file; remove it") from None
        raise


def _acquire(path: Path, what: str) -> int:
    while True:
        fd = _open(path, what)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(
                f"{what}: {path.parent} is in use by another run ({holder} holds {path}); "
                "wait for it to end or stop it, or choose another directory"
            ) from None
        except OSError as err:
            os.close(fd)
            # ENOSYS: Lustre mounted without -o flock (or with -o noflock).
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise UserError(
                    f"{what}: {path} cannot be locked ({err.strerror}): the filesystem does not support "
                    "flock (Lustre needs to be mounted with -o flock); choose a directory on one that does"
                ) from None
            raise
        # A holder that made the directory removes it and its lock file on leaving: what we locked may
        # be that unlinked file, while a third run locks a new one. Lock again, on the file now there.
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    return fd


@contextlib.contextmanager
def run_lock(directory: Path, what: str) -> Iterator[None]:
    """Hold `directory` for this run (made if missing), or raise UserError naming who holds it.

    `what` names the setting that chose the directory (`output_dir=runs/x`). Directories made here
    and left holding only the lock file are removed on leaving, so that a stage that fails its own
    checks leaves nothing behind."""
    key = str(directory.resolve())
    held = [d for d in os.environ.get(HELD_ENV, "").split(os.pathsep) if d]
    if key in held:
        yield
        return
    made = [d for d in (directory, *directory.parents) if not d.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    fd = _acquire(path, what)
    previous = os.environ.get(HELD_ENV)
    os.environ[HELD_ENV] = os.pathsep.join([*held, key])
    try:
        yield
    finally:
        if previous is None:
            del os.environ[HELD_ENV]
        else:
            os.environ[HELD_ENV] = previous
        if made and [p.name for p in directory.iterdir()] == [LOCK_FILE]:
            path.unlink()  # while still held: see _acquire
        os.close(fd)
        for d in made:
            try:
                d.rmdir()
            except OSError:  # not empty (or never emptied): the run wrote there
                break


def holds_a_run(directory: Path) -> bool:
    """Whether `directory` holds anything besides a lock file: what a fresh run must not overwrite."""
    return directory.is_dir() and any(p.name != LOCK_FILE for p in directory.iterdir())
