"""io/run_lock.py on filesystems that cannot lock: the stage stops with an error naming the lock file
and the filesystem's limit, as a UserError (printed without a traceback)."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from emoji_rl.errors import UserError
from emoji_rl.io.run_lock import run_lock


@pytest.mark.parametrize(
    "code",
    [
        errno.ENOSYS,  # Lustre mounted without -o flock
        errno.ENOLCK,  # NFS without a lock manager
        errno.EOPNOTSUPP,
    ],
)
def test_a_filesystem_without_flock_is_named_not_a_traceback(tmp_path, monkeypatch, code):
    def flock(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", flock)
    run = tmp_path / "run"
    with pytest.raises(UserError) as refused, run_lock(run, f"output_dir={run}"):
        pytest.fail("the run went on without its lock")
    message = str(refused.value)
    assert message.startswith(f"output_dir={run}: {run / '.lock'} cannot be locked ({os.strerror(code)})")
    assert "the filesystem does not support flock (Lustre needs to be mounted with -o flock)" in message
