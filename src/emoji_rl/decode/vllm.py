"""The vLLM sampler: sender turns sampled by a vLLM server (docs/DESIGN.md §7; requests and answers as
in docs/VLLM.md §2, §7). A trainer keeps the server on its newest adapter (`rl/rollout/vllm.py`).

`VLLMSampler` sends each prompt of a turn batch as its own seeded `/v1/completions` request, all at
once, with a token-id prompt and the emoji grammar as top-level `structured_outputs` (none for a
free-text game, whose trainer masks only the LM head's padding ids: the request biases them off,
`PADDING_BIAS`), and keeps the returned token ids as sampled (stop token included) with their
log-probs: never re-tokenized text.

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
from collections.abc import Sequence
from typing import Any

import httpx

from emoji_rl.decode.generate import Constraint, Decoding
from emoji_rl.decode.sampler import Sample
from emoji_rl.emoji.constraint import vllm_structured_outputs
from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import Endpoint, ServerError, request

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
    """A `Sampler` backed by a vLLM server; `model` is the adapter (or base) name it samples from, as
    `decoding` says (its `batch_size` is the server's to choose: every prompt is sent at once, at most
    `max_concurrent_requests` open).

    Its samples are a function of `seed` and how many `sample()` calls came before (module docstring):
    the trainer samples through `at(version, name, seed)` copies, one per adapter version."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        stop_token_id: int,
        decoding: Decoding,
        *,
        padding: range = range(0),
        seed: int = 0,
        max_concurrent_requests: int = 256,
    ) -> None:
        if max_concurrent_requests < 1:
            raise UserError(f"max_concurrent_requests={max_concurrent_requests} must be >= 1")
        if decoding.constraint == "static" or decoding.searches or decoding.stop_ids:
            raise UserError(
                f"the vLLM sampler samples under the emoji grammar or none, ending at end of turn: not "
                f"{decoding.constraint!r} with num_beams={decoding.num_beams}, guidance_scale="
                f"{decoding.guidance_scale} and {len(decoding.stop_ids)} stop ids"
            )
        if decoding.temperature <= 0:
            raise UserError(
                f"temperature={decoding.temperature} must be > 0: the trainer scores tokens at the "
                "sampling temperature"
            )
        self.endpoint = endpoint
        self.model = model
        self.stop_token_id = stop_token_id
        self.temperature = decoding.temperature
        self.max_new_tokens = decoding.max_new_tokens
        self.seed = seed
        self.version: int | None = None
        self.max_concurrent_requests = max_concurrent_requests
        self.constraint = decoding.constraint
        self._structured_outputs = vllm_structured_outputs(decoding.min_emoji, decoding.max_emoji)
        # `padding`: the ids the model's logits have past its tokenizer's (`template.padding_ids`).
        self._logit_bias = {str(i): PADDING_BIAS for i in padding} if padding else None
        self._calls = 0  # sample() calls so far: the `call` of the next one's request seeds

    def at(self, version: int, model: str, seed: int) -> VLLMSampler:
        """A copy bound to one adapter version: it samples from `model` (the adapter's served name),
        stamps every Sample with `version`, and seeds its requests from `seed`, its call count
        starting at 0. The original is left as it is."""
        bound = copy.copy(self)
        bound.model, bound.version, bound.seed, bound._calls = model, version, seed, 0
        return bound

    def request_body(
        self, prompt: Sequence[int], seed: int, constraint: Constraint | None = None
    ) -> dict[str, object]:
        """The `/v1/completions` body for one token-id prompt, sampled with `seed` under `constraint`
        (None: the sampler's)."""
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
        constraint = constraint or self.constraint
        if constraint == "static":
            raise UserError("the vLLM sampler samples under the emoji grammar or none, not the static mask")
        if constraint == "grammar":
            body["structured_outputs"] = self._structured_outputs
        elif self._logit_bias is not None:
            body["logit_bias"] = self._logit_bias
        return body

    def _client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.max_concurrent_requests)
        return httpx.AsyncClient(timeout=self.endpoint.timeout_s, limits=limits)

    async def sample(
        self,
        prompts: Sequence[tuple[int, ...]],
        previous: Sequence[Sample | None] | None = None,
        *,
        constraint: Constraint | None = None,
    ) -> list[Sample]:
        """One request per prompt, all sent concurrently (at most `max_concurrent_requests` open),
        prompt i of this call seeded with `request_seed(self.seed, call, i)`, under `constraint` (None:
        the sampler's); answers in prompt order, each stamped with `self.version`.

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
                        self._sample_one(
                            client,
                            gate,
                            self.request_body(prompt, request_seed(self.seed, call, i), constraint),
                        )
                        for i, prompt in enumerate(prompts)
                    )
                )
            )

    async def _sample_one(
        self, client: httpx.AsyncClient, gate: asyncio.Semaphore, body: dict[str, object]
    ) -> Sample:
        async with gate:
            try:
                response = await request(client, self.endpoint, "POST", "/v1/completions", body)
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
