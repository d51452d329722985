"""A write that a full disk cut short, named as such: torch's checkpoint writer reports a short write
only as "[enforce fail at inline_container.cc:...] unexpected pos N vs M", with no path and no errno."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from emoji_rl.errors import UserError


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds `path` (or would: its first existing ancestor)."""
    path = Path(os.path.abspath(path))
    while not path.exists():
        path = path.parent
    while not os.path.ismount(path):
        path = path.parent
    return path


def short_write(err: BaseException) -> bool:
    """Whether `err` is what a write gives when the disk (or the user's quota) is full."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(err, RuntimeError) and "unexpected pos" in str(err)


def disk_full_error(what: str, path: Path, err: BaseException, after: str) -> UserError:
    """A UserError for `err` (a `short_write`) raised writing `what` at `path`: the filesystem, its
    free space now, and `after` (what was cleaned up, what the run still has, how to go on)."""
    mount = mount_point(path)
    free = shutil.disk_usage(mount).free
    return UserError(
        f"writing {what} at {path} failed: no space left on the filesystem mounted at {mount} "
        f"({free / 2**20:.0f} MiB free now; the error: {str(err).strip() or type(err).__name__}). {after}"
    )
