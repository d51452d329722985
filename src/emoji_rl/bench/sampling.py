"""The `engine_sampling` rows of `make bench` (issue #54, items 8 and 9): what two fields of the
rollouts' requests cost vLLM's engine, as its tokens/s with and without each, at `ROWS` requests at
once, the GPU profile's B x G = 128 rollouts of a step twice over.

- `seed`: every request carries its own (rl/rollout/vllm.py, `request_seed`). vLLM then draws each
  seeded row's noise with its own generator: on a GPU `random_sample`'s per-row loop over the whole
  vocabulary (v1/sample/ops/topk_topp_sampler.py, "can be slow"); on the CPU engine `forward_cpu`
  draws one seed per row for its fused Gumbel-argmax, a much cheaper loop. The CPU row measures the
  latter, not the GPU's.
- `logit_bias`: a game without a grammar (Wordle) masks the LM head's 243 padding ids this way.
  vLLM's `LogitBiasLogitsProcessor` rebuilds its tables from every biased request's dict whenever a
  request joins or leaves the batch (v1/sample/logits_processor/builtin.py): a rollout's requests
  end at different lengths, so nearly every decode step pays one rebuild. A third row times that
  rebuild alone, with vLLM's own class in the engine's venv, against the CPU engine's decode step.

The requests are the sampler's own (`VLLMSampler.request_body`) with the field under test dropped,
no grammar, the same prompts and the same lengths in every arm (8 to 24 tokens, `ignore_eos`), so the
arms decode the same tokens. Arms alternate and each keeps its fastest of `REPEATS` runs: other
processes only ever slow a run. On the CPU a decode step of `ROWS` rows takes about a second, so a
few milliseconds a step are below the noise; launch/gpu_smoke.sh runs the same arms against the
GPU's policy server, where a step takes tens of milliseconds:

    python -m emoji_rl.bench.sampling --url http://127.0.0.1:8002 --model policy --api_key_env POLICY_API_KEY
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from emoji_rl.bench.engine import ENGINE_VENV, engine_env, server_endpoint, server_parser, start_server
from emoji_rl.bench.row import Row, print_rows
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import Endpoint, request
from emoji_rl.lm import models, template
from emoji_rl.rl.rollout.vllm import VLLMSampler

ROWS = 256
REPEATS = 3
LENGTHS = (8, 24)  # tokens a request decodes, drawn per request (seeded): they leave the batch apart
PADDING_IDS = 243  # Qwen3.5's: 248,320 logits over 248,077 tokens
ARMS = ("plain", "seeded", "biased")
GOAL = 0.95  # the cost of a field worth removing from the requests, or moving to the server: 5%


def request_bodies(tokenizer, model: str, rows: int, arm: str) -> list[dict[str, object]]:
    """The arm's requests: the sampler's bodies, without a grammar, with a seed only in the seeded
    arm and the padding bias only in the biased one. The bias covers the tokenizer's last
    `PADDING_IDS` ids: any ids cost the same, and a model without padding ids has no others."""
    vocab = len(tokenizer)
    sampler = VLLMSampler(
        Endpoint("http://bench"),
        model,
        template.stop_token_id(tokenizer),
        grammar=False,
        padding=range(vocab - PADDING_IDS, vocab),
    )
    lengths = random.Random(0)
    bodies = []
    for i in range(rows):
        prompt = template.chat_ids(tokenizer, sender_messages(f"message {i}: meet me at the beach at noon"))
        body = sampler.request_body(prompt, seed=1000 + i)
        body.update(max_tokens=lengths.randint(*LENGTHS), ignore_eos=True)
        del body["stop_token_ids"]  # every arm decodes max_tokens
        if arm != "seeded":
            del body["seed"]
        if arm != "biased":
            del body["logit_bias"]
        bodies.append(body)
    return bodies


async def _tokens_per_second(endpoint: Endpoint, bodies: list[dict[str, object]]) -> float:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(timeout=endpoint.timeout_s, limits=limits) as client:
        start = time.perf_counter()
        answers = await asyncio.gather(
            *(request(client, endpoint, "POST", "/v1/completions", b) for b in bodies)
        )
        seconds = time.perf_counter() - start
    return sum(answer.json()["usage"]["completion_tokens"] for answer in answers) / seconds


def measure(endpoint: Endpoint, model: str, rows: int, repeats: int) -> dict[str, float]:
    """Each arm's tokens/s against the server at `endpoint` serving `model`: the fastest of
    `repeats` runs, the arms alternating, after one unmeasured run."""
    cards = httpx.get(endpoint.url + "/v1/models", headers=endpoint.headers()).json()["data"]
    roots = {card["id"]: card["root"] for card in cards}
    if model not in roots:
        raise UserError(
            f"{endpoint.url} serves {sorted(roots)}, not {model!r}: pass --model, a served base model"
        )
    tokenizer = models.load_tokenizer(roots[model])  # the served model's own (its path or hub id)
    bodies = {arm: request_bodies(tokenizer, model, rows, arm) for arm in ARMS}
    asyncio.run(_tokens_per_second(endpoint, bodies["plain"]))  # first calls, caches
    rates = dict.fromkeys(ARMS, 0.0)
    for _ in range(repeats):
        for arm in ARMS:
            rates[arm] = max(rates[arm], asyncio.run(_tokens_per_second(endpoint, bodies[arm])))
    return rates


def arm_rows(rates: dict[str, float], rows: int, where: str) -> list[Row]:
    plain = rates["plain"]
    return [
        Row(
            f"{where} tok/s, {rows} requests: {name} / plain",
            f"{rates[arm]:.1f} tok/s",
            f"{plain:.1f} tok/s",
            rates[arm] / plain,
            f">= {GOAL}x",
            rates[arm] / plain >= GOAL,
        )
        for arm, name in (("seeded", "a seed each"), ("biased", f"{PADDING_IDS}-id logit_bias"))
    ]


# Run in the engine's venv: vLLM's own LogitBiasLogitsProcessor, its tables rebuilt as one of `rows`
# biased requests leaves the batch and another joins (what a decode step in which rows end pays).
_REBUILD = """
import sys, time, torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor
from vllm.v1.sample.logits_processor.interface import BatchUpdate
rows, ids, rounds = int(sys.argv[1]), int(sys.argv[2]), 50
params = SamplingParams(logit_bias={i: -100.0 for i in range(ids)})
bias = LogitBiasLogitsProcessor(None, torch.device("cpu"), False)
bias.update_state(BatchUpdate(rows, [], [(i, params, None, []) for i in range(rows)], []))
start = time.perf_counter()
for _ in range(rounds):
    bias.update_state(BatchUpdate(rows - 1, [rows - 1], [], []))
    bias.update_state(BatchUpdate(rows, [], [(rows - 1, params, None, [])], []))
print((time.perf_counter() - start) / (2 * rounds) * 1000)
"""


def rebuild_ms(rows: int) -> float:
    """Milliseconds vLLM's logit-bias tables take to rebuild over `rows` biased requests (CPU)."""
    python = ENGINE_VENV / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", _REBUILD, str(rows), str(PADDING_IDS)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"timing vLLM's LogitBiasLogitsProcessor failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def bench_engine_sampling() -> list[Row]:
    """The rows on the CPU engine (`make setup-vllm-engine`): the policy server as the tests start
    it, with room for `ROWS` requests at once."""
    if not (ENGINE_VENV / "bin" / "vllm").is_file():
        raise RuntimeError(f"no vLLM CPU engine at {ENGINE_VENV}: run `make setup-vllm-engine`")
    # 2 GiB of KV cache: 256 requests of 93 tokens at SmolLM2's 46 KB a token (fp32). A step's token
    # budget that holds every prompt whole: vLLM 0.33's CPU engine fails a step in which a seeded
    # request's prompt was split (it rewinds the request's generator, and a CPU generator has no
    # offset: gpu_model_runner.py, _bookkeeping_sync).
    env = engine_env(CPU_KVCACHE_GIB="2", POLICY_MAX_MODEL_LEN="1024")
    args = ("--served-model-name", "policy", "--max-num-seqs", str(ROWS), "--max-num-batched-tokens", "32768")
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server("serve_policy.sh", Path(tmp) / "policy.log", env, *args)
        try:
            rates = measure(Endpoint(server.url, timeout_s=600.0), "policy", ROWS, REPEATS)
        finally:
            server.stop()
    # A full batch's decode step, from the plain arm's rate: about, as its batch thins out at the end.
    step_ms = ROWS / rates["plain"] * 1000
    rebuild = rebuild_ms(ROWS)
    return [
        *arm_rows(rates, ROWS, "CPU engine"),
        Row(
            f"logit_bias rebuild, {ROWS} requests: decode step / (step + rebuild)",
            f"{rebuild:.1f} ms",
            f"{step_ms:.0f} ms step",
            step_ms / (step_ms + rebuild),
            f">= {GOAL}x",
            step_ms / (step_ms + rebuild) >= GOAL,
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = server_parser(
        "python -m emoji_rl.bench.sampling",
        "Tokens/s of a running vLLM server with and without the rollouts' seed and padding bias.",
        "the served model name to sample from",
    )
    parser.add_argument("--rows", type=int, default=ROWS, help="requests at once")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="runs of each arm; the fastest counts")
    args = parser.parse_args(argv)
    endpoint = server_endpoint(args)
    print_rows(arm_rows(measure(endpoint, args.model, args.rows, args.repeats), args.rows, "server"))


if __name__ == "__main__":
    main()
