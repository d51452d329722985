"""The `vllm` rollout engine: sender turns sampled by a vLLM server that hot-loads every new LoRA
adapter (docs/DESIGN.md §7; requests and answers as in docs/VLLM.md §2, §4, §7).

- `VLLMSampler` sends each prompt of a turn batch as its own seeded `/v1/completions` request, all
  at once, with a token-id prompt and the emoji grammar as top-level `structured_outputs` (none for
  a free-text game, whose trainer masks only the LM head's padding ids: the request
  biases them off, `PADDING_BIAS`), and keeps the returned token ids as sampled (stop token
  included) with their log-probs: never re-tokenized text.
- `AdapterSync` saves the adapter after each update, loads it under a versioned name, points the
  sampler at it and unloads stale versions.
- `wait_for_server` (in `rl.endpoint`) waits for the server before training starts.

Log-probs. The trainer compares the sampler's log-probs with its own, log_softmax(masked logits / T)
(`batch.token_logprobs`), in the truncated importance weights and in `sampler/kl_vs_trainer`. vLLM
masks the logits with the grammar first, but its default `raw_logprobs` are taken before temperature;
`processed_logprobs` are those of the distribution it actually sampled from. So the request pins every
other sampling transform to neutral (top_p 1, top_k 0, min_p 0, no penalties: whatever the server's
generation config says), launch/serve_policy.sh runs `--logprobs-mode processed_logprobs`, and
`VLLMSampler.verify()` refuses a raw-mode server unless the temperature is 1, where the modes agree.

Seeds. Every sampled turn is a function of (run seed, step, call, row): the trainer binds the sampler
to each adapter version with a seed of its own (`at`), and prompt i of its c-th `sample()` call is
sampled with `request_seed(seed, c, i)`. vLLM applies a request's `seed` to every prompt of a batch
request, so identical prompts in one batch (the G rollouts of a group on their first turn) would get
identical samples and different ones would share their noise: each prompt goes as its own request.
The server's prefix cache still computes a shared prefix once, and its scheduler batches the requests.
(The seed fixes the draws; the logits drawn from can still differ in their last bits with the batch
the server computes them in.)
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import re
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from emoji_rl.decode.generate import MAX_NEW_TOKENS
from emoji_rl.decode.sampler import Sample
from emoji_rl.emoji.alphabet import MAX_EMOJI, MIN_EMOJI
from emoji_rl.emoji.constraint import vllm_structured_outputs
from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import LORA_RANK_ERROR, Endpoint, ServerError, request, request_sync

log = logging.getLogger("emoji_rl.rollout.vllm")

LOGPROBS_MODE = "processed_logprobs"
"""The `--logprobs-mode` launch/serve_policy.sh starts the policy server with (see the module docstring)."""
# The logprobs-mode probe: the same one-token request at T=1 and T=0.25. Raw log-probs do not depend
# on T; processed ones at T=0.25 are log_softmax(4 z), which moves every top-5 value but a sure top-1.
_PROBE_TEMPERATURE = 0.25
_PROBE_TOP = 5
_PROBE_TOLERANCE = 0.1  # bf16 numerics differ a little between two requests; the T effect is far larger


PADDING_BIAS = -100.0
"""The `logit_bias` of the LM head's padding ids (Qwen3.5: ids 248,077-248,319 of 248,320 logits) in a
request without the grammar (which allows none of them): vLLM clamps a bias to [-100, 100], and adds
it to the logits in float32 before sampling, where exp(-100) makes a padding id's probability exactly
0 unless its logit stands 3.3 above the largest token's. `allowed_token_ids`, exact, would send all
248,077 token ids in every request (1.9 MB of JSON, 16 ms of vLLM's validation each)."""


def request_seed(seed: int, call: int, index: int) -> int:
    """A stable 62-bit seed for prompt `index` of the sampler's `call`-th sample() call.

    A hash, not arithmetic such as seed + index: vLLM draws sample j of an `n > 1` request from
    seed + j (v1/engine/parallel_sampling.py), and so does the fake server, so nearby seeds would
    repeat each other's streams. blake2b rather than Python's hash(), which is salted per process for
    strings: the next run would not see the same seeds. 62 bits: vLLM takes a signed 64-bit seed, and
    this leaves room for the + j."""
    digest = hashlib.blake2b(f"{seed}:{call}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


class VLLMSampler:
    """A `Sampler` backed by a vLLM server; `model` is the adapter (or base) name it samples from.

    Its samples are a function of `seed` and how many `sample()` calls came before (module docstring):
    the trainer samples through `at(version, name, seed)` copies, one per adapter version."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        stop_token_id: int,
        *,
        temperature: float = 1.0,
        max_new_tokens: int = MAX_NEW_TOKENS,
        min_emoji: int = MIN_EMOJI,
        max_emoji: int = MAX_EMOJI,
        grammar: bool = True,
        padding: range = range(0),
        seed: int = 0,
        version: int | None = None,
        max_concurrent_requests: int = 256,
    ) -> None:
        if max_concurrent_requests < 1:
            raise UserError(f"max_concurrent_requests={max_concurrent_requests} must be >= 1")
        if temperature <= 0:
            raise UserError(
                f"temperature={temperature} must be > 0: the trainer scores tokens at the sampling temperature"
            )
        self.endpoint = endpoint
        self.model = model
        self.stop_token_id = stop_token_id
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.version = version
        self.max_concurrent_requests = max_concurrent_requests
        self._structured_outputs = vllm_structured_outputs(min_emoji, max_emoji) if grammar else None
        # `padding`: the ids the model's logits have past its tokenizer's (`template.padding_ids`).
        self._logit_bias = None if grammar or not padding else {str(i): PADDING_BIAS for i in padding}
        self._calls = 0  # sample() calls so far: the `call` of the next one's request seeds

    def at(self, version: int, model: str, seed: int) -> VLLMSampler:
        """A copy bound to one adapter version: it samples from `model` (the adapter's served name),
        stamps every Sample with `version`, and seeds its requests from `seed`, its call count
        starting at 0. The original is left as it is."""
        bound = copy.copy(self)
        bound.model, bound.version, bound.seed, bound._calls = model, version, seed, 0
        return bound

    def request_body(self, prompt: Sequence[int], seed: int) -> dict[str, object]:
        """The `/v1/completions` body for one token-id prompt, sampled with `seed`."""
        body: dict[str, object] = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "logprobs": 0,
            "return_token_ids": True,
            "stop_token_ids": [self.stop_token_id],
            "seed": seed,
        }
        if self._structured_outputs is not None:
            body["structured_outputs"] = self._structured_outputs
        if self._logit_bias is not None:
            body["logit_bias"] = self._logit_bias
        return body

    def _client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.max_concurrent_requests)
        return httpx.AsyncClient(timeout=self.endpoint.timeout_s, limits=limits)

    async def sample(
        self, prompts: Sequence[tuple[int, ...]], previous: Sequence[Sample | None] | None = None
    ) -> list[Sample]:
        """One request per prompt, all sent concurrently (at most `max_concurrent_requests` open),
        prompt i of this call seeded with `request_seed(self.seed, call, i)`; answers in prompt order,
        each stamped with `self.version`.

        Every call counts, an empty one too (it sends nothing): the seeds of a call depend only on how
        many calls came before, never on what they held. The count is taken before the first await, so
        calls running at once get distinct counts, in the order they were made."""
        # `previous` is not needed: the server's prefix cache already holds each episode's last turn.
        call = self._calls
        self._calls += 1
        gate = asyncio.Semaphore(self.max_concurrent_requests)
        async with self._client() as client:
            return list(
                await asyncio.gather(
                    *(
                        self._sample_one(client, gate, prompt, request_seed(self.seed, call, i))
                        for i, prompt in enumerate(prompts)
                    )
                )
            )

    async def _sample_one(
        self, client: httpx.AsyncClient, gate: asyncio.Semaphore, prompt: Sequence[int], seed: int
    ) -> Sample:
        async with gate:
            try:
                response = await request(
                    client, self.endpoint, "POST", "/v1/completions", self.request_body(prompt, seed)
                )
            except ServerError as err:
                hint = self._hint(err)
                if hint is None:
                    raise
                raise UserError(f"{err}; {hint}") from err
        return self._sample(response.json())

    def _hint(self, err: ServerError) -> str | None:
        if err.param == "model":
            return (
                f"adapter {self.model!r} is not loaded there: did the server restart? "
                "AdapterSync.publish loads a new version after every update"
            )
        if err.param == "input_tokens":
            return (
                "an episode outgrew the server's --max-model-len: raise POLICY_MAX_MODEL_LEN "
                "(launch/serve_policy.sh), or lower max_turns or max_new_tokens"
            )
        return None

    def _sample(self, body: Any) -> Sample:
        url = self.endpoint.url + "/v1/completions"
        choices = body["choices"]
        if len(choices) != 1:
            raise UserError(f"{url} returned {len(choices)} choices for one prompt")
        [choice] = choices
        ids = choice.get("token_ids")
        if ids is None:
            raise UserError(
                f"{url} returned no token_ids: `return_token_ids` needs vLLM >= 0.10.2 (use 0.33.0)"
            )
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if logprobs is None or len(logprobs) != len(ids):
            raise UserError(
                f"{url} returned {len(ids)} token ids but log-probs {logprobs!r}: expected one per token"
            )
        return Sample(tuple(ids), tuple(float(lp) for lp in logprobs), version=self.version)

    async def verify(self) -> None:
        """Check, before training, that the server serves `model` and returns the log-probs of the
        distribution it samples from (see the module docstring)."""
        async with self._client() as client:
            cards = (await request(client, self.endpoint, "GET", "/v1/models")).json()["data"]
            served = [card["id"] for card in cards]
            if self.model not in served:
                raise UserError(
                    f"{self.endpoint.url} serves {served}, not {self.model!r}: start launch/serve_policy.sh "
                    f"with POLICY_NAME={self.model}, or set the served name in the config to one of those"
                )
            if self.temperature != 1.0 and not await self._processed_logprobs(client):
                raise UserError(
                    f"{self.endpoint.url} returns raw log-probs (taken before temperature) but "
                    f"temperature={self.temperature}: the trainer's importance weights need the log-probs "
                    f"of the distribution sampled from. Restart it with --logprobs-mode {LOGPROBS_MODE} "
                    "(launch/serve_policy.sh does), or sample at temperature 1.0"
                )

    async def _processed_logprobs(self, client: httpx.AsyncClient) -> bool:
        tops = []
        for temperature in (1.0, _PROBE_TEMPERATURE):
            body = {
                "model": self.model,
                "prompt": [self.stop_token_id],
                "max_tokens": 1,
                "temperature": temperature,
                "top_p": 1.0,
                "top_k": 0,
                "min_p": 0.0,
                "logprobs": _PROBE_TOP,
            }
            choice = (await request(client, self.endpoint, "POST", "/v1/completions", body)).json()[
                "choices"
            ][0]
            tops.append(sorted(choice["logprobs"]["top_logprobs"][0].values(), reverse=True)[:_PROBE_TOP])
        return max(abs(a - b) for a, b in zip(*tops, strict=False)) > _PROBE_TOLERANCE


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
