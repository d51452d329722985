"""Run metrics: one JSON line per step in `metrics.jsonl` and the same scalars in TensorBoard.

Keys are slash-namespaced and stable (`reward/mean`, `optim/kl`, `time/rollout_s`), so runs compare
on a dashboard and in `jq`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import TracebackType

from emoji_rl.io.jsonl import drop_steps_after


class MetricsWriter:
    """Appends `{"step": n, **metrics}` lines; a resumed run keeps the lines of earlier steps only."""

    def __init__(self, run_dir: str | Path, resume_from_step: int = 0, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Steps after the checkpoint were logged by a run that then died: they are redone, so drop them.
        drop_steps_after(self.path, resume_from_step)
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=resume_from_step + 1)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
