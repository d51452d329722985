"""The `engine_prefix_cache` rows of `make bench` (issue #53): how much of a multi-turn episode a vLLM
server reads from its prefix cache, from the server's own counters (`io.server_metrics.read_prefix_cache`).

Qwen3.5 is hybrid: vLLM 0.33 makes the attention blocks of a hybrid model at least as large as one
Gated DeltaNet state (`Platform._align_hybrid_block_size`, vllm/platforms/interface.py): 528, 576
or 640 tokens for Qwen3.5-4B in bf16 on a GPU, with its kernels, and 640 on the CPU, where a
full-attention model's are 16. A cache hit is whole blocks unless `--prefix-match-unit` is finer, and
our episodes are a few hundred tokens: which one a server runs decides whether turn t+1 re-reads turn
t's whole context (docs/VLLM.md §9).

The episodes: `targets` retrieval targets x `group` rollouts each (a GRPO group shares its opening),
`turns` sender turns, all of a turn's requests at once. Turn 1's prompt is the sender's chat in
Qwen3.5's tokens, as `bench.shapes.step_episodes` writes it; the reply is what the server samples, as
long as that function's emoji messages (`ignore_eos`), then `<|im_end|>`; turn t+1's prompt is turn
t's prompt, its reply and the game's correction. Every turn after the first so extends a context the
server has just computed, as a GRPO step's rollouts do. A model with a smaller vocabulary gets each
id modulo its size: the cache sees the same lengths and the same shared prefixes. No `seed`: vLLM's
block hashes do not read it (`generate_block_hash_extra_keys`, v1/core/kv_cache_utils.py), and the
CPU engine fails a seeded request whose prefill it splits, which a hybrid model's cache does at
every checkpoint (docs/VLLM.md §2, §9).

The rows serve, on the CPU engine, SmolLM2 (full attention, `--block-size 32`, the smallest the CPU
attention takes) and a random Qwen3.5 with Qwen3.5-4B's per-layer shapes (`save_hybrid`), bf16 as on
a GPU, with vLLM's defaults and then with serve_policy.sh's `--prefix-match-unit`. launch/gpu_smoke.sh
plays the same episodes against the GPU's policy server:

    python -m emoji_rl.bench.prefix_cache --url http://127.0.0.1:8002 --model policy --api_key_env POLICY_API_KEY
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from emoji_rl.bench.engine import ENGINE_VENV, engine_env, server_endpoint, server_parser, start_server
from emoji_rl.bench.row import Row
from emoji_rl.decode.prefill import common_length
from emoji_rl.emoji.sender_prompts import correction_message, sender_messages
from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import Endpoint, request
from emoji_rl.io.server_metrics import PrefixCache, cache_config, read_metrics, read_prefix_cache

TARGETS = 8
GROUP = 4  # the gpu profile's group_size
TURNS = 5  # its max_turns
HIT_UNIT = 16
"""serve_policy.sh's `--prefix-match-unit` for a hybrid model."""
GOAL = 0.8  # of full attention's hits: the share of the reuse a hybrid server must keep
SENTENCES = (
    "Let's grab pizza and watch a movie tonight",
    "The train to the airport leaves at seven",
    "My cat knocked the plant off the shelf again",
    "We won the football match in the last minute",
    "I forgot my umbrella and got soaked on the way home",
    "The bakery on the corner sells the best croissants",
    "Can you water the garden while I am away",
    "Our flight was delayed because of the snowstorm",
)


@dataclass(frozen=True)
class Episode:
    opening: list[int]
    corrections: list[list[int]]
    """The game's turn after each sender turn but the last, ending where the next reply starts."""
    replies: list[int]
    """Tokens the server samples at each turn, before the `<|im_end|>` the episode then adds."""


@dataclass(frozen=True)
class TurnCache:
    turn: int
    prompt_tokens: int
    reusable: int
    """Prompt tokens the server computed at an earlier turn or for an earlier request (a shared
    prefix), less each prompt's last token, which vLLM always computes: what an exact cache reuses."""
    counters: PrefixCache
    """The server's counters over this turn's requests alone."""


def _qwen_chat(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def episodes(
    targets: int = TARGETS,
    group: int = GROUP,
    turns: int = TURNS,
    seed: int = 0,
    vocab_size: int | None = None,
) -> tuple[list[Episode], int]:
    """The episodes in Qwen3.5's tokens (each id modulo `vocab_size` if given), and `<|im_end|>`."""
    from emoji_rl.bench.shapes import step_episodes
    from emoji_rl.emoji.qwen_vocab import qwen_tokenizer

    tokenizer = qwen_tokenizer("qwen3.5")
    assistant = "<|im_start|>assistant\n"
    ids = (lambda tokens: [t % vocab_size for t in tokens]) if vocab_size else list
    lengths = [[len(t.action_ids) - 1 for t in e.turns] for e in step_episodes(targets * group, turns, seed)]
    rng = random.Random(seed)
    played = []
    for t in range(targets):
        target = SENTENCES[t % len(SENTENCES)] + (f" ({t})" if t >= len(SENTENCES) else "")
        opening = ids(tokenizer.encode(_qwen_chat(sender_messages(target)) + assistant))
        for _ in range(group):
            guesses = [rng.choice(SENTENCES) for _ in range(turns - 1)]
            corrections = [
                ids(tokenizer.encode("\n" + _qwen_chat([correction_message(g, target)]) + assistant))
                for g in guesses
            ]
            played.append(Episode(opening, corrections, lengths[len(played)]))
    return played, ids([tokenizer.im_end_id])[0]


def reusable(prompts: list[list[int]], computed: list[list[int]]) -> int:
    """What of `prompts` an exact prefix cache holds, given `computed` before them: each prompt's
    longest prefix shared with one of those or with an earlier prompt, less its last token."""
    total = 0
    for i, prompt in enumerate(prompts):
        best = max((common_length(prompt, seq) for seq in [*computed, *prompts[:i]]), default=0)
        total += min(best, len(prompt) - 1)
    return total


async def _replies(
    endpoint: Endpoint, model: str, prompts: list[list[int]], lengths: list[int]
) -> list[list[int]]:
    async def one(client: httpx.AsyncClient, prompt: list[int], tokens: int) -> list[int]:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 1.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        answer = await request(client, endpoint, "POST", "/v1/completions", body)
        return list(answer.json()["choices"][0]["token_ids"])

    limits = httpx.Limits(max_connections=len(prompts))
    async with httpx.AsyncClient(timeout=endpoint.timeout_s, limits=limits) as client:
        return await asyncio.gather(*(one(client, p, n) for p, n in zip(prompts, lengths, strict=True)))


def vocabulary(endpoint: Endpoint, model: str) -> int:
    """The size of the served model's tokenizer (the path or hub id vLLM loaded it from)."""
    from transformers import AutoTokenizer

    cards = httpx.get(endpoint.url + "/v1/models", headers=endpoint.headers()).json()["data"]
    roots = {card["id"]: card["root"] for card in cards}
    if model not in roots:
        raise UserError(
            f"{endpoint.url} serves {sorted(roots)}, not {model!r}: pass --model, a served base model"
        )
    return len(AutoTokenizer.from_pretrained(roots[model]))


def play(
    endpoint: Endpoint, model: str, targets: int = TARGETS, group: int = GROUP, turns: int = TURNS
) -> list[TurnCache]:
    """Play the episodes against the server, turn by turn: the counters over each turn."""
    vocab = vocabulary(endpoint, model)
    played, im_end = episodes(targets, group, turns)
    if max(im_end, *(t for e in played for seq in (e.opening, *e.corrections) for t in seq)) >= vocab:
        played, im_end = episodes(targets, group, turns, vocab_size=vocab)
    prompts = [list(e.opening) for e in played]
    computed: list[list[int]] = []
    rows = []
    for turn in range(turns):
        can_reuse = reusable(prompts, computed)
        before = read_prefix_cache(endpoint)
        replies = asyncio.run(_replies(endpoint, model, prompts, [e.replies[turn] for e in played]))
        rows.append(
            TurnCache(turn + 1, sum(map(len, prompts)), can_reuse, read_prefix_cache(endpoint) - before)
        )
        computed = [p + r for p, r in zip(prompts, replies, strict=True)]
        if turn + 1 < turns:
            prompts = [
                p + r + [im_end] + e.corrections[turn]
                for p, r, e in zip(prompts, replies, played, strict=True)
            ]
    return rows


def total(rows: list[TurnCache]) -> PrefixCache:
    return PrefixCache(sum(r.counters.queries for r in rows), sum(r.counters.hits for r in rows))


def blocks(endpoint: Endpoint) -> str:
    """The block size the server settled on, a hybrid model's alignment included, and its
    --prefix-match-unit, from its /metrics (`vllm:cache_config_info`)."""
    config = cache_config(read_metrics(endpoint))
    return f"block_size {config.get('block_size', '?')}, prefix_match_unit {config.get('prefix_match_unit', '?')}"


def print_turns(rows: list[TurnCache], title: str) -> None:
    print(title)
    print(f"{'turn':>4}  {'prompt tokens':>13}  {'reusable':>8}  {'queried':>8}  {'hits':>8}  hit rate")
    for r in rows:
        c = r.counters
        print(
            f"{r.turn:>4}  {r.prompt_tokens:>13}  {r.reusable:>8}  {c.queries:>8}  {c.hits:>8}  {c.rate:8.3f}"
        )
    whole = total(rows)
    print(
        f"hit rate: {whole.rate:.3f} ({whole.hits} of {whole.queries} prompt tokens from the cache)",
        flush=True,
    )


def save_hybrid(directory: Path) -> Path:
    """A random Qwen3.5 (the real class, text only) with Qwen3.5-4B's per-layer shapes, which size
    vLLM's blocks: its Gated DeltaNet heads and widths, its attention's KV heads and head size, and the
    float32 recurrent state its config asks for (`mamba_ssm_dtype`, which vLLM reads for Qwen3.5:
    Qwen3_5ForConditionalGenerationConfig, model_executor/models/config.py). Narrow elsewhere, 8
    layers in the real pattern (3 linear attention, then 1 full), SmolLM2's tokenizer."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from emoji_rl.bench.shapes import QWEN3_5_4B
    from emoji_rl.lm import models

    tokenizer = models.load_tokenizer(models.SMOLLM2)
    pattern = ["linear_attention"] * 3 + ["full_attention"]
    config = Qwen3_5TextConfig(
        **(QWEN3_5_4B | dict(hidden_size=256, intermediate_size=512, vocab_size=len(tokenizer))),
        num_hidden_layers=8,
        layer_types=[pattern[i % 4] for i in range(8)],
        mamba_ssm_dtype="float32",
        eos_token_id=tokenizer.eos_token_id,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    Qwen3_5ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def bench_engine_prefix_cache() -> list[Row]:
    """The rows on the CPU engine (`make setup-vllm-engine`): each server started by serve_policy.sh
    (GPUS=0) in turn, the same episodes played against each."""
    if not (ENGINE_VENV / "bin" / "vllm").is_file():
        raise RuntimeError(f"no vLLM CPU engine at {ENGINE_VENV}: run `make setup-vllm-engine`")
    rates: dict[str, PrefixCache] = {}
    with tempfile.TemporaryDirectory() as tmp:
        hybrid = str(save_hybrid(Path(tmp) / "qwen3_5"))
        arms = {
            "full attention (SmolLM2), block 32": ({}, ("--block-size", "32")),
            "hybrid, vLLM's defaults": ({"POLICY_MODEL": hybrid}, ("--dtype", "bfloat16")),
            f"hybrid, --prefix-match-unit {HIT_UNIT}": (
                {"POLICY_MODEL": hybrid},
                ("--dtype", "bfloat16", "--prefix-match-unit", str(HIT_UNIT)),
            ),
        }
        for name, (settings, args) in arms.items():
            env = engine_env(CPU_KVCACHE_GIB="4", POLICY_MAX_MODEL_LEN="1024", **settings)
            log = Path(tmp) / f"server-{len(rates)}.log"
            server = start_server("serve_policy.sh", log, env, "--served-model-name", "policy", *args)
            endpoint = Endpoint(server.url, timeout_s=600.0)
            try:
                rows = play(endpoint, "policy")
                served = blocks(endpoint)
            finally:
                server.stop()
            print_turns(rows, f"{name}: {served}")
            rates[name] = total(rows)
    full, *_ = rates.values()
    return [
        Row(
            f"prefix-cache hit rate, {TARGETS * GROUP} x {TURNS}-turn episodes: {name} / full attention",
            f"{rate.rate:.1%}",
            f"{full.rate:.1%}",
            rate.rate / full.rate,
            f">= {GOAL}x" if "unit" in name else "-",
            rate.rate / full.rate >= GOAL if "unit" in name else None,
        )
        for name, rate in list(rates.items())[1:]
    ]


def main(argv: list[str] | None = None) -> None:
    parser = server_parser(
        "python -m emoji_rl.bench.prefix_cache",
        "The prefix-cache hit rate of multi-turn episodes shaped like ours on a running vLLM server.",
        "the served base model to sample from",
    )
    parser.add_argument("--targets", type=int, default=TARGETS, help="episodes per target: --group")
    parser.add_argument("--group", type=int, default=GROUP)
    parser.add_argument("--turns", type=int, default=TURNS)
    args = parser.parse_args(argv)
    endpoint = server_endpoint(args)
    rows = play(endpoint, args.model, args.targets, args.group, args.turns)
    # launch/gpu_smoke.sh's summary prints from this line on.
    print_turns(rows, f"prefix cache, {endpoint.url} {args.model}: {blocks(endpoint)}")


if __name__ == "__main__":
    main()
