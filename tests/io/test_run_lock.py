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


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_left_alone(tmp_path):
    run, target = tmp_path / "run", tmp_path / "precious.txt"
    run.mkdir()
    target.write_text("keep me\n")
    (run / ".lock").symlink_to(target)
    refused = pytest.raises(UserError, match=r"\.lock is a symbolic link, not a lock file; remove it")
    with refused, run_lock(run, f"output_dir={run}"):
        pytest.fail("the run went on without its lock")
    assert target.read_text() == "keep me\n"


def test_a_lock_file_that_is_a_directory_is_named(tmp_path):
    run = tmp_path / "run"
    (run / ".lock").mkdir(parents=True)
    refused = pytest.raises(UserError, match=r"\.lock is a directory, not a lock file; remove it")
    with refused, run_lock(run, f"output_dir={run}"):
        pytest.fail("the run went on without its lock")


def test_a_held_lock_with_garbage_in_it_is_shown_without_its_control_bytes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_bytes(b"\x1b[2J\x00evil\x07 host\x1b]0;x\x07\n")
    holder = os.open(run / ".lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: another holder
    try:
        with (
            pytest.raises(UserError, match="is in use by another run") as refused,
            run_lock(run, "output_dir"),
        ):
            pytest.fail("the run went on while another held the directory")
    finally:
        os.close(holder)
    message = str(refused.value)
    assert "evil" in message and not any(c in message for c in "\x1b\x00\x07")
