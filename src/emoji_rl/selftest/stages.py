"""Training through the real classes: one LoRA step, a few steps of the project's own sft and grpo
stages (each then resumed from its checkpoint) on a small random Qwen3.5 saved to a temporary
directory, and the decode speed of the project's generate path."""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

import torch

from emoji_rl.bench.shapes import NARROW_QWEN3_5, QWEN3_5_4B, TARGET, cut_qwen3_5_4b, peak_rss_above_now
from emoji_rl.lm import models
from emoji_rl.selftest.core import Config, Result, Skipped, check, dtype_name, is_cuda, need_module

# On a CPU the model is narrowed (hidden 256) so the check takes seconds; on CUDA it has Qwen3.5-4B's
# own widths. Both keep the real vocabulary, head shapes and layer pattern.
LORA_LAYERS = 4
CPU_WIDTHS = {"hidden_size": 256, "intermediate_size": 512}


def lora_model(runtime: models.Runtime, layers: int, rank: int) -> torch.nn.Module:
    """`layers` of Qwen3.5-4B (its widths on CUDA, CPU_WIDTHS on a CPU) in the runtime's dtype on its
    device, with peft's LoRA of `rank` on the project's DEFAULT_TARGETS."""
    from peft import LoraConfig, get_peft_model

    from emoji_rl.lm.lora import DEFAULT_TARGETS, resolve_targets

    widths = {} if is_cuda(runtime) else CPU_WIDTHS
    with torch.device(runtime.device):
        model = cut_qwen3_5_4b(layers, attn_implementation=runtime.attn_implementation, **widths)
    model.to(runtime.dtype)
    targets = resolve_targets(model, DEFAULT_TARGETS, "selftest")
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))


@check("lora-step")
def lora_step(cfg: Config, runtime: models.Runtime) -> Result:
    """One LoRA training step (peft) through Qwen3_5ForCausalLM with a right-padded row, as the
    trainers pad (rl/batch.py, TRL's collator): loss and gradients finite, and the peak memory it took."""
    cuda = is_cuda(runtime)
    model = lora_model(runtime, LORA_LAYERS, rank=16)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-3)
    ids = torch.randint(QWEN3_5_4B["vocab_size"], (2, 64), device=runtime.device)
    mask = torch.ones_like(ids)
    # Right, not left: a left-padded row's first queries see no key at all, and cuDNN's SDPA backward
    # returns NaN for such a row in bf16 (an H200, torch 2.11+cu130: docs/gpu/selftest-2026-11-28-h200.md).
    # No training batch of ours has one; generation left-pads but takes no gradient.
    mask[1, -16:] = 0
    losses = []
    # bf16 base weights, peft's fp32 LoRA weights, under autocast: as accelerate's bf16 mixed precision.
    bf16 = runtime.dtype == torch.bfloat16

    def step() -> None:
        with torch.autocast(runtime.device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    if cuda:
        torch.cuda.reset_peak_memory_stats()
        step()
        memory = f"peak {torch.cuda.max_memory_allocated() / 1e9:.2f} GB allocated"
    else:
        peak_mb, _ = peak_rss_above_now(step)
        memory = f"peak RSS {peak_mb:.0f} MB above the built model"
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in named if p.grad is None]
    broken = [n for n, p in named if p.grad is not None and not bool(p.grad.isfinite().all())]
    moved = sum(int(p.grad.count_nonzero()) > 0 for p in trained if p.grad is not None)
    shape = f"{LORA_LAYERS} layers, hidden {model.config.hidden_size}, vocab {model.config.vocab_size:,}"
    figure = (
        f"{shape}, {dtype_name(runtime.dtype)} + {dtype_name(trained[0].dtype)} LoRA ({len(trained)} tensors, "
        f"{moved} with gradient), attention {model.config._attn_implementation}: loss {losses[0]:.2f}, {memory}"
    )
    ok = math.isfinite(losses[0]) and not missing and not broken and moved > 0
    if ok:
        return Result("PASS", figure)
    # Which tensors, by name: a FAIL that only counts them leaves the next run to find them.
    where = "; ".join(
        f"{what}: {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}"
        for what, names in (("no gradient", missing), ("non-finite gradient", broken))
        if names
    )
    return Result("FAIL", f"{figure}; {where or 'non-finite loss or no gradient moved'}")


# --- the sft and grpo stages on a small random Qwen3.5 ---------------------------------------------

# ChatML, as Qwen3.5's template writes a chat without tools or thinking.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
STAGE_LAYERS = 4
# A CPU takes seconds a step only with every width small: at the real linear-attention heads (32 x 128)
# transformers' torch Gated DeltaNet took 14 s an SFT step and 3 minutes a GRPO step on 2 cores. The
# vocabulary is the byte tokenizer's 259 ids padded to 512, as Qwen3.5 pads its 248,077 to 248,320.
CPU_STAGE_MODEL = dict(NARROW_QWEN3_5, vocab_size=512)
TARGETS = (
    TARGET,
    "I'm so excited for our beach trip this weekend",
    "The cat is asleep on the warm sofa",
    "We missed the last train home again",
)
FIRST_STEPS = 2  # then one more, resumed from the checkpoint of step FIRST_STEPS


def byte_tokenizer():
    """A byte-level BPE without merges, with ChatML's special tokens and template: any text, emoji
    included, is its UTF-8 bytes, so the grammar and the chat template work with nothing downloaded."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHATML,
    )


def stage_model(runtime: models.Runtime):
    """(model, tokenizer): 4 layers of Qwen3.5 in its pattern, random, in the runtime's dtype on its
    device: Qwen3.5-4B's widths and vocabulary on CUDA, CPU_STAGE_MODEL on a CPU."""
    tokenizer = byte_tokenizer()
    sizes = {} if is_cuda(runtime) else CPU_STAGE_MODEL
    ids = {name: getattr(tokenizer, name) for name in ("pad_token_id", "eos_token_id")}
    with torch.device(runtime.device):
        model = cut_qwen3_5_4b(STAGE_LAYERS, bos_token_id=None, **ids, **sizes)
    return model.to(runtime.dtype), tokenizer


def save_stage_model(runtime: models.Runtime, directory: Path) -> str:
    """`stage_model` saved where the stages load a local model from, with SFT and RL data beside it."""
    from emoji_rl.emoji.alphabet import ALPHABET
    from emoji_rl.emoji.sender_prompts import sender_messages
    from emoji_rl.io.jsonl import write_jsonl

    model, tokenizer = stage_model(runtime)
    model.save_pretrained(directory / "model")
    tokenizer.save_pretrained(directory / "model")
    answers = [" ".join(ALPHABET[7 * i + j] for j in range(3)) for i in range(len(TARGETS))]
    chats = [
        [*sender_messages(t), {"role": "assistant", "content": a}]
        for t, a in zip(TARGETS, answers, strict=True)
    ]
    write_jsonl(directory / "sft.jsonl", [{"messages": chat} for chat in chats])
    write_jsonl(directory / "rl.jsonl", [{"target": t} for t in TARGETS])
    return str(directory / "model")


# all-MiniLM-L6-v2's shape (the retrieval game's similarity model), random, on the byte tokenizer: the
# embedded MiniLM is a 90 MB package a GPU box without a registry may lack, and the grpo check tests the
# trainer, not the embedder's weights.
MINILM = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)


def save_stage_embedder(directory: Path) -> str:
    """A random BERT of MiniLM's shape with the byte tokenizer, saved where sentence-transformers loads
    it (mean pooling, as MiniLM's own); its path, for the grpo stage's similarity_model."""
    from transformers import BertConfig, BertModel

    tokenizer = byte_tokenizer()
    tokenizer.model_max_length = 512
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **MINILM)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(directory / "embedder")
    tokenizer.save_pretrained(directory / "embedder")
    return str(directory / "embedder")


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def resumed_at(before: list[dict], after: list[dict], key: str) -> list[int]:
    """The steps logged with `key` after a resume, [] if the resumed run did not keep the first run's
    lines up to its last step's (it started over; what followed, sft's closing summary, is redone): a
    resume at the right step logs FIRST_STEPS + 1 alone."""
    kept = 1 + max((i for i, row in enumerate(before) if key in row), default=-1)
    if not kept or after[:kept] != before[:kept]:
        return []
    return [row["step"] for row in after[kept:] if key in row]


def _resume_result(name: str, steps: list[int], finite: bool, written: bool, extra: str) -> Result:
    want = [FIRST_STEPS + 1]
    ok = steps == want and finite and written
    figure = (
        f"{FIRST_STEPS} steps, then resumed: {'step ' + str(steps[0]) if steps == want else f'logged steps {steps}, want {want}'}"
        f"; loss {'finite' if finite else 'NOT finite'}; adapter {'written' if written else 'MISSING'}; {extra}"
    )
    if not steps:
        figure += f"; the resumed {name} did not keep the first run's metrics: it started over"
    return Result("PASS" if ok else "FAIL", figure)


def _stages_device(runtime: models.Runtime) -> None:
    # The stages pick their device themselves (CUDA when torch sees it).
    if not is_cuda(runtime) and torch.cuda.is_available():
        raise Skipped("--device cpu, but the sft and grpo stages run on CUDA when it is there")


def _peak(runtime: models.Runtime, work) -> str:
    if is_cuda(runtime):
        torch.cuda.reset_peak_memory_stats()
        work()
        return f"peak {torch.cuda.max_memory_allocated() / 1e9:.2f} GB allocated"
    peak_mb, _ = peak_rss_above_now(work)
    return f"peak RSS {peak_mb:.0f} MB above the start"


@check("sft-steps")
def sft_steps(cfg: Config, runtime: models.Runtime) -> Result:
    """`emoji-rl sft` (TRL + PEFT, bf16 on CUDA) for FIRST_STEPS steps on a small random Qwen3.5, then
    once more with --resume true: the loss finite, the adapter written, the resumed run at the step
    after its checkpoint."""
    need_module("trl", "the sft stage")
    _stages_device(runtime)
    from emoji_rl.sft import train as sft

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        fields = dict(
            model=save_stage_model(runtime, directory),
            train_data=str(directory / "sft.jsonl"),
            eval_data=None,
            output_dir=str(directory / "sft"),
            per_device_train_batch_size=2,
            effective_batch_size=2,
            lora_r=8,
            lora_alpha=16,
            logging_steps=1,
            save_steps=1,
        )
        sft.main(sft.Config(max_steps=FIRST_STEPS, **fields))
        before = _metrics(directory / "sft")
        sft.main(sft.Config(max_steps=FIRST_STEPS + 1, resume=True, **fields))
        after = _metrics(directory / "sft")
        losses = [row["train/loss"] for row in after if "train/loss" in row]
        written = (directory / "sft" / sft.ADAPTER_DIR / "adapter_model.safetensors").is_file()
    steps = resumed_at(before, after, "train/loss")
    extra = f"losses {', '.join(f'{x:.3f}' for x in losses)} ({dtype_name(runtime.dtype)})"
    return _resume_result("sft", steps, all(map(math.isfinite, losses)), written, extra)


# Nats a token, the mean of sampler minus trainer log-prob (`sampler/kl_vs_trainer`). The hf engine
# samples with the model being trained, so only bf16 decode (one token at a time, from a cache)
# against the trainer's whole-sequence forward separates them: a mask, temperature or cache read wrongly
# shows as a gap of tenths (fp32 on a CPU: ~1e-8).
SAMPLER_GAP_BOUND = 0.05


@check("grpo-steps")
def grpo_steps(cfg: Config, runtime: models.Runtime) -> Result:
    """`emoji-rl grpo` with the in-process (hf) engine under the emoji grammar, the lexicon judge and a
    random embedder of MiniLM's shape, FIRST_STEPS steps then one resumed: the loss finite, the adapter written, the resumed run at the
    right step, the sampler-vs-trainer log-prob gap within SAMPLER_GAP_BOUND; peak memory reported."""
    need_module("sentence_transformers", "the grpo stage's similarity")
    _stages_device(runtime)
    from emoji_rl.rl import train as grpo
    from emoji_rl.rl.train_config import grpo_config

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        fields = dict(
            model=save_stage_model(runtime, directory),
            init_adapter=None,
            train_data=str(directory / "rl.jsonl"),
            output_dir=str(directory / "grpo"),
            engine="hf",
            judge="lexicon",
            similarity_model=save_stage_embedder(directory),
            batch_size=2,
            group_size=2,
            max_turns=1,
            per_device_train_batch_size=4,
            lora_r=8,
            lora_alpha=16,
            save_steps=1,
        )
        before: list[dict] = []

        def both() -> None:
            grpo.main(grpo_config(max_steps=FIRST_STEPS, **fields))
            before.extend(_metrics(directory / "grpo"))
            grpo.main(grpo_config(max_steps=FIRST_STEPS + 1, resume=True, **fields))

        memory = _peak(runtime, both)
        after = _metrics(directory / "grpo")
        written = (directory / "grpo" / "adapter" / "adapter_model.safetensors").is_file()
    gaps = [row["sampler/kl_vs_trainer"] for row in after if "sampler/kl_vs_trainer" in row]
    finite = all(math.isfinite(row["optim/loss"]) for row in after if "optim/loss" in row)
    worst = max(map(abs, gaps), default=math.nan)
    result = _resume_result(
        "grpo",
        resumed_at(before, after, "reward/mean"),
        finite,
        written,
        f"sampler - trainer log-prob {worst:.1e} a token at most (bound {SAMPLER_GAP_BOUND}); {memory}",
    )
    if result.status == "PASS" and not worst <= SAMPLER_GAP_BOUND:
        return Result("FAIL", f"{result.figure}; the sampler's log-probs are not the trainer's")
    return result


# Rows and tokens a row: the gpu profile's 128 rollouts (32 prompts x 4) on CUDA; a CPU, a few.
DECODE = {"cuda": (128, 64), "cpu": (8, 16)}


@check("decode-speed")
def decode_speed(cfg: Config, runtime: models.Runtime) -> Result:
    """Tokens a second through `generate.generate_from_ids`, every row decoded together, without and
    with the emoji grammar: reported, not judged."""
    from emoji_rl.decode.generate import generate_from_ids
    from emoji_rl.emoji.sender_prompts import sender_messages
    from emoji_rl.lm.template import chat_ids

    rows, tokens = DECODE["cuda" if is_cuda(runtime) else "cpu"]
    model, tokenizer = stage_model(runtime)
    model.eval()
    prompts = [chat_ids(tokenizer, sender_messages(TARGETS[i % len(TARGETS)])) for i in range(rows)]
    speeds = {}
    for constraint in ("none", "grammar"):
        options = dict(constraint=constraint, batch_size=rows, seed=0)
        generate_from_ids(model, tokenizer, prompts, max_new_tokens=2, **options)  # the grammar, kernels
        start = time.perf_counter()
        replies = generate_from_ids(model, tokenizer, prompts, max_new_tokens=tokens, **options)
        sampled = sum(len(reply.token_ids) for reply in replies)
        speeds[constraint] = sampled / (time.perf_counter() - start)
    layers = f"{STAGE_LAYERS} of Qwen3.5-4B's layers" if is_cuda(runtime) else f"{STAGE_LAYERS} narrow layers"
    figure = (
        f"{rows} rows x up to {tokens} tokens, {layers}, {dtype_name(runtime.dtype)}: "
        f"{speeds['none']:.0f} tokens/s unconstrained, {speeds['grammar']:.0f} under the grammar "
        "(rows leave when they end a message)"
    )
    return Result("PASS", figure)
