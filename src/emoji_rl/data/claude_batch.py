"""The Claude teacher over the Message Batches API, safe to kill at any point.

The state file (JSON, replaced atomically) lists every batch this teacher created, with its custom
ids and whether its results were collected. The order of writes makes a restart exact:

1. before `create`, the custom ids go into `pending`: a crash after the API made the batch but
   before its id was saved leaves a trace. The next run looks for that batch among those created
   since (same request count, id not yet known), adopts it if found and otherwise submits again;
2. the batch id is saved, then polled: a restart polls the same batch and never submits its items
   again (a request is skipped when its custom id is in a batch not yet collected);
3. results are yielded one by one to the stage, which appends each to its answers log before asking
   for the next; only then is the batch marked collected. A crash in between re-reads the results
   (the API keeps them for 29 days) and the stage drops what it already has.

Errored, expired or canceled items come back as answers with an error; the stage asks for them again
with the next attempt number, so they go to a new batch (up to `max_attempts`).

A custom id is `<prompt id>_<attempt>`, so an answer maps back to its prompt and attempt with no
lookup table. Batch creation is not retried by the SDK (a lost response would make a second batch);
a failed `create` goes through step 1's check before it is tried again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from emoji_rl.data import claude
from emoji_rl.data.teachers import Answer, Request, teacher_system, teacher_turns
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import write_json

if TYPE_CHECKING:
    import anthropic

log = logging.getLogger(__name__)

# The API caps a batch at 100,000 requests or 256 MB; few-shot requests are ~2 KB each.
BATCH_SIZE = 10_000
# A batch made just before our clock read `started_at` (clock skew with the API) still counts.
_CLOCK_SLACK_S = 300.0


def custom_id(request: Request) -> str:
    return f"{request.id}_{request.attempt}"


def split_custom_id(cid: str) -> tuple[str, int]:
    prompt_id, attempt = cid.rsplit("_", 1)
    return prompt_id, int(attempt)


@dataclass
class BatchRecord:
    id: str
    custom_ids: list[str]
    collected: bool = False


@dataclass
class PendingSubmission:
    custom_ids: list[str]
    started_at: float
    """Unix time just before `create` was sent."""


@dataclass
class BatchState:
    batches: list[BatchRecord] = field(default_factory=list)
    pending: PendingSubmission | None = None

    @classmethod
    def load(cls, path: Path) -> BatchState:
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text())
            pending = PendingSubmission(**data["pending"]) if data["pending"] else None
            return cls([BatchRecord(**b) for b in data["batches"]], pending)
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise UserError(
                f"{path} is not a batch state file this version understands ({err}); it lists batches "
                "already paid for, so fix it by hand rather than deleting it"
            ) from None

    def save(self, path: Path) -> None:
        write_json(path, dataclasses.asdict(self))


class ClaudeBatchTeacher:
    name = "claude-batch"

    def __init__(
        self,
        client: anthropic.Anthropic,
        model: str,
        state_path: Path,
        max_tokens: int,
        poll_interval_s: float,
        submit_retries: int,
    ) -> None:
        self.client, self.model, self.state_path = client, model, state_path
        self.max_tokens, self.poll_interval_s, self.submit_retries = (
            max_tokens,
            poll_interval_s,
            submit_retries,
        )

    def params(self, target: str) -> dict[str, object]:
        return {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": teacher_system(),
            "messages": teacher_turns(target),
        }

    def run(self, requests: list[Request]) -> Iterator[Answer]:
        state = BatchState.load(self.state_path)
        if state.pending is not None:
            self._reconcile(state)
        in_flight = {cid for b in state.batches if not b.collected for cid in b.custom_ids}
        fresh = [r for r in requests if custom_id(r) not in in_flight]
        if len(fresh) < len(requests):
            log.info("resuming: %d requests are already in submitted batches", len(requests) - len(fresh))
        for start in range(0, len(fresh), BATCH_SIZE):
            self._submit(state, fresh[start : start + BATCH_SIZE])
        for batch in state.batches:
            if not batch.collected:
                yield from self._collect(batch)
                batch.collected = True
                state.save(self.state_path)

    def _submit(self, state: BatchState, chunk: list[Request]) -> None:
        import anthropic

        ids = [custom_id(r) for r in chunk]
        body = [
            {"custom_id": cid, "params": self.params(r.target)} for cid, r in zip(ids, chunk, strict=True)
        ]
        for attempt in range(self.submit_retries + 1):
            state.pending = PendingSubmission(ids, time.time())
            state.save(self.state_path)
            try:
                batch = self.client.with_options(max_retries=0).messages.batches.create(requests=body)  # type: ignore[arg-type]
            except anthropic.APIError as err:
                if not claude.is_transient(err):
                    state.pending = None
                    state.save(self.state_path)
                    raise claude.fatal(err, "creating a message batch") from err
                log.warning(
                    "creating a batch failed (%s); checking whether it was made", claude.describe(err)
                )
                if self._reconcile(state):
                    return
                time.sleep(min(2.0**attempt, 60.0))
                continue
            state.batches.append(BatchRecord(batch.id, ids))
            state.pending = None
            state.save(self.state_path)
            log.info("submitted batch %s with %d requests", batch.id, len(ids))
            return
        raise UserError(
            f"could not create a message batch after {self.submit_retries + 1} tries; rerun to resume "
            f"(state in {self.state_path})"
        )

    def _reconcile(self, state: BatchState) -> bool:
        """Adopt the batch a crashed or failed `create` may have made; True if one was found."""
        pending = state.pending
        assert pending is not None
        known = {b.id for b in state.batches}
        found = []
        # Listed newest first: stop at batches older than the submission.
        for batch in self.client.messages.batches.list(limit=100):
            if batch.created_at.timestamp() < pending.started_at - _CLOCK_SLACK_S:
                break
            counts = batch.request_counts
            total = counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
            if batch.id not in known and total == len(pending.custom_ids):
                found.append(batch.id)
        if len(found) > 1:
            raise UserError(
                f"{len(found)} batches ({', '.join(found)}) may be the submission recorded as pending in "
                f"{self.state_path}; add the right one to its `batches` (collected: false) and clear "
                "`pending`, then rerun"
            )
        if found:
            log.info("adopting batch %s, created before the previous run could record it", found[0])
            state.batches.append(BatchRecord(found[0], pending.custom_ids))
        state.pending = None
        state.save(self.state_path)
        return bool(found)

    def _collect(self, batch: BatchRecord) -> Iterator[Answer]:
        while True:
            info = self.client.messages.batches.retrieve(batch.id)
            if info.processing_status == "ended":
                break
            log.info("batch %s: %s, %d requests", batch.id, info.processing_status, len(batch.custom_ids))
            time.sleep(self.poll_interval_s)
        expected = set(batch.custom_ids)
        for item in self.client.messages.batches.results(batch.id):
            if item.custom_id not in expected:
                continue
            expected.discard(item.custom_id)
            prompt_id, attempt = split_custom_id(item.custom_id)
            result = item.result
            if result.type == "succeeded":
                yield Answer(prompt_id, attempt, claude.message_text(result.message))
            elif result.type == "errored":
                yield Answer(prompt_id, attempt, None, f"api error: {result.error.error.type}")
            else:
                yield Answer(prompt_id, attempt, None, f"batch {result.type}")
        # Never lose an item: one the results do not mention is asked again.
        for cid in sorted(expected):
            yield Answer(*split_custom_id(cid), None, "missing from batch results")
