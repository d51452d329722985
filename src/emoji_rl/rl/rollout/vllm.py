"""The trainer's side of the `vllm` rollout engine: the policy server kept on the adapter being trained
(docs/DESIGN.md §7; what vLLM does with the adapters, docs/VLLM.md §4). The sampler itself is
`decode/vllm.py`; when each version is published and which one samples which step is the schedule's
(`rl/rollout/schedule.py`).
"""

from __future__ import annotations

import logging
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import httpx

from emoji_rl.decode.vllm import VLLMSampler
from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import LORA_RANK_ERROR, ServerError, request_sync

log = logging.getLogger("emoji_rl.rollout.vllm")


class AdapterSync:
    """Publishes each adapter version to the policy server and points the sampler at it.

    Version k of this trainer's session is saved to `<run_dir>/adapters/<session>/step-<k>` and loaded
    as `<base_name>-<session>-v<k>`, `session` a random id drawn when the trainer starts. vLLM keys
    its prefix cache on (name, path) and keeps the entries after an unload, so a name and path that
    came back with other weights would be served KV computed under the old ones: a rerun into the
    same run directory and every --resume redo steps, with new weights, that an earlier session
    published (docs/VLLM.md §4). The last `keep` versions stay loaded and on disk (vLLM re-reads an
    adapter evicted from its CPU cache from its path); older ones are unloaded and deleted. The server
    must see `run_dir` at the same path: the same machine, or a shared filesystem.

    One run per policy server: `clear_stale` unloads every version of `base_name` an earlier session
    left loaded. Under accelerate only the main process publishes; the others `follow` the name it
    published.
    """

    def __init__(
        self,
        sampler: VLLMSampler,
        run_dir: str | Path,
        base_name: str,
        keep: int = 2,
        session: str | None = None,
    ) -> None:
        if keep < 1:
            raise UserError(f"keep={keep} must be >= 1: the adapter being sampled from stays loaded")
        self.endpoint = sampler.endpoint
        self.sampler = sampler
        self.session = session or secrets.token_hex(4)
        self.root = Path(run_dir).resolve() / "adapters"
        self.base_name = base_name
        self.keep = keep
        self._loaded: list[tuple[str, Path]] = []
        # This session's names and an earlier one's; `<base>-v<k>` was the form before sessions.
        self._version = re.compile(rf"{re.escape(base_name)}(-[0-9a-f]+)?-v\d+")

    def adapter_name(self, step: int) -> str:
        return f"{self.base_name}-{self.session}-v{step}"

    def adapter_path(self, step: int) -> Path:
        """Where version `step` is saved while it is kept (the server reads it from there)."""
        return self.root / self.session / f"step-{step:06d}"

    def _client(self) -> httpx.Client:
        return httpx.Client(timeout=self.endpoint.timeout_s)

    def clear_stale(self) -> list[str]:
        """Unload the versions of this base name that the server holds from an earlier session, and
        delete what earlier sessions left under this run's adapters directory. Returns the names
        unloaded."""
        with self._client() as client:
            cards = request_sync(client, self.endpoint, "GET", "/v1/models").json()["data"]
            stale = [card["id"] for card in cards if self._version.fullmatch(card["id"])]
            for name in stale:
                self._unload(client, name)
        if self.root.is_dir():
            for left in self.root.iterdir():
                if left.name != self.session:
                    shutil.rmtree(left, ignore_errors=True)
        return stale

    def publish(self, step: int, save: Callable[[Path], None]) -> str:
        """Save the adapter with `save(directory)` (e.g. PEFT `save_pretrained`), load it, switch
        the sampler to it, and retire versions beyond `keep`. Returns the adapter name."""
        name = self.adapter_name(step)
        path = self.adapter_path(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Saved beside the final path and renamed, so the server never reads a half-written adapter.
        tmp = path.with_name(f".{path.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save(tmp)
        if not (tmp / "adapter_config.json").is_file():
            raise UserError(
                f"saving the adapter into {tmp} wrote no adapter_config.json: is it a PEFT adapter?"
            )
        tmp.rename(path)
        with self._client() as client:
            self._load(client, name, path)
            self.sampler.model = name
            self._loaded.append((name, path))
            while len(self._loaded) > self.keep:
                old_name, old_path = self._loaded.pop(0)
                self._unload(client, old_name)
                shutil.rmtree(old_path, ignore_errors=True)
        log.info("policy server now samples from %s (%s)", name, path)
        return name

    def follow(self, name: str) -> str:
        """Switch the sampler to the version the main process published (its `publish` answer)."""
        self.sampler.model = name
        return name

    def _load(self, client: httpx.Client, name: str, path: Path) -> None:
        body = {"lora_name": name, "lora_path": str(path), "load_inplace": False}
        try:
            request_sync(client, self.endpoint, "POST", "/v1/load_lora_adapter", body)
        except ServerError as err:
            if err.missing_route:
                hint = (
                    "runtime LoRA loading is off: start the server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 "
                    "and --enable-lora (launch/serve_policy.sh does)"
                )
            elif err.status == 404:
                hint = (
                    f"the server found no adapter at {path}: it must see the run directory at the same "
                    "path (run it on this machine or on a shared filesystem)"
                )
            elif rank := LORA_RANK_ERROR.search(err.message):
                hint = (
                    f"the adapter's rank r={rank[1]} is above the server's --max-lora-rank {rank[2]}: restart "
                    f"launch/serve_policy.sh with POLICY_MAX_LORA_RANK >= {rank[1]} (its header lists the "
                    "values vLLM accepts), or train an adapter of a lower rank"
                )
            elif err.status >= 500:
                hint = "the server kept failing to load it: read the server's log"
            else:
                hint = "one training run per policy server: another run may be loading the same names"
            raise UserError(f"loading adapter {name!r}: {err}; {hint}") from err

    def _unload(self, client: httpx.Client, name: str) -> None:
        try:
            request_sync(client, self.endpoint, "POST", "/v1/unload_lora_adapter", {"lora_name": name})
        except ServerError as err:
            if err.status != 404 or err.missing_route:
                raise UserError(f"unloading adapter {name!r}: {err}") from err
            log.info("adapter %s was already unloaded", name)
