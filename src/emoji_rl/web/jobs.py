"""Model work off the request threads: one worker thread runs the jobs in order, a page polls a
job's state by its id, and finished jobs are kept a while for late polls."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import Record
from emoji_rl.web.runners import Stopped

KEPT_JOBS = 2000  # finished jobs a page may still poll for; older ones are forgotten


class BadInput(UserError):
    """What a person typed cannot be played; the message says what and is shown on the page."""


@dataclass
class _Job:
    state: str = "queued"  # queued | running | done | error
    result: Record | None = None
    error: str | None = None


class Jobs:
    """Model work on one worker thread (the models are shared and not thread-safe), so a request
    never waits for a generation: it gets a job id and the page polls it."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="models")
        self._jobs: OrderedDict[str, _Job] = OrderedDict()
        self._lock = threading.Lock()

    def _add(self, job: _Job) -> str:
        job_id = uuid.uuid4().hex
        with self._lock:
            self._jobs[job_id] = job
            while len(self._jobs) > KEPT_JOBS:
                self._jobs.popitem(last=False)
        return job_id

    def done(self, result: Record) -> str:
        """A job finished already, with `result`: what a repeated request gets, polled like any job."""
        return self._add(_Job("done", result))

    def submit(self, work: Callable[[], Record]) -> str:
        job = _Job()
        job_id = self._add(job)

        def run() -> None:
            job.state = "running"
            try:
                job.result = work()
                job.state = "done"
            except UserError as err:
                job.error, job.state = str(err), "error"
            except Stopped as err:
                job.error, job.state = f"{err}: start a new round once it is back", "error"
            except Exception as err:  # shown to the page; the server keeps serving
                job.error, job.state = f"the models failed: {type(err).__name__}: {err}", "error"

        self._pool.submit(run)
        return job_id

    def status(self, job_id: str) -> Record:
        with self._lock:
            job = self._jobs.get(job_id)
            ahead = sum(
                j.state == "queued" for j in itertools.takewhile(lambda j: j is not job, self._jobs.values())
            )
        if job is None:
            raise BadInput(f"unknown job {job_id!r}: the server restarted or forgot it; start a new round")
        return {"state": job.state, "ahead": ahead, "result": job.result, "error": job.error}

    def close(self) -> None:
        """Drop the queued jobs and wait for the running one (`Models.stop` first, to cut it short)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
