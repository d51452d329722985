"""A full disk, for real: /dev/full answers every write with ENOSPC, which torch's writer turns into its
"unexpected pos" error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from emoji_rl.io.disk import disk_full_error, mount_point, short_write


def _write_to_dev_full(tmp_path: Path) -> BaseException:
    path = tmp_path / "state.pt"
    path.symlink_to("/dev/full")
    with pytest.raises(RuntimeError) as caught:
        torch.save({"weights": torch.zeros(1000)}, path)
    return caught.value


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_torchs_short_write_and_enospc_are_a_full_disk_and_other_errors_are_not(tmp_path):
    err = _write_to_dev_full(tmp_path)
    assert "unexpected pos" in str(err) and short_write(err)
    with pytest.raises(OSError) as caught, open("/dev/full", "w") as full:
        full.write("x" * 100_000)
        full.flush()
    assert short_write(caught.value)
    assert not short_write(RuntimeError("CUDA out of memory")) and not short_write(PermissionError(13, "no"))


def test_the_message_names_the_path_the_filesystem_and_its_free_space(tmp_path):
    err = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    target = tmp_path / "run" / "checkpoints" / ".step-000004.tmp"  # not there: its ancestors are
    message = str(disk_full_error("checkpoint step 4", target, err, "Removed."))
    assert (
        f"at {target} failed: no space left on the filesystem mounted at {mount_point(tmp_path)}" in message
    )
    assert (
        "MiB free now" in message and "unexpected pos 704 vs 598" in message and message.endswith("Removed.")
    )
