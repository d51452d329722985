"""Qwen3.5-4B's real shapes, for the measurements and checks that cannot download it: its config's
widths and head shapes (`cut_qwen3_5_4b` builds the real class at any depth with random weights), the
gpu profile's step sizes, a step's episodes in Qwen3.5's tokens, its grammar, and peak memory."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from emoji_rl.emoji.alphabet import ALPHABET
from emoji_rl.emoji.sender_prompts import correction_message, sender_messages
from emoji_rl.play.types import Episode, StepResult, Turn

if TYPE_CHECKING:
    from transformers import Qwen3_5ForCausalLM

    from emoji_rl.emoji.constraint import EmojiConstraint

# Qwen/Qwen3.5-4B's config.json (text part): every width and head shape, not its depth (32 layers:
# 3 linear-attention, then 1 full-attention, eight times).
QWEN3_5_4B = dict(
    vocab_size=248320,
    hidden_size=2560,
    intermediate_size=9216,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    tie_word_embeddings=True,
)
QWEN3_5_4B_LAYERS = 32
# configs/gpu/grpo.yaml
EPISODES = 32 * 4
TURNS = 5
MICRO_BATCH = 8
DECODE_ROWS = 128
# Wordle's micro-batch under the gpu profile reaches 6,144 sender tokens; a sixth of it keeps the
# whole-vocabulary baseline within this machine's memory.
UNCONSTRAINED_TOKENS = 1024
TARGET = "Let's grab pizza and watch a movie tonight"
GUESS = "A party with food and a film at home"
# Qwen3.5's heads and widths, every one small: for what runs the real classes and layer pattern on a
# CPU in seconds and depends on no width.
NARROW_QWEN3_5 = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
)


def cut_qwen3_5_4b(layers: int, **overrides: object) -> Qwen3_5ForCausalLM:
    """Qwen3.5-4B's shapes with `layers` decoder layers in its own pattern, random weights, fp32;
    `overrides` replace fields of its config (a narrower hidden size where a CPU must be quick)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    pattern = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    config = Qwen3_5TextConfig(
        **(QWEN3_5_4B | overrides),
        num_hidden_layers=layers,
        layer_types=[pattern[i % 4] for i in range(layers)],
    )
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(config).eval()


def _qwen_chat(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def step_episodes(count: int = EPISODES, turns: int = TURNS, seed: int = 0) -> list[Episode]:
    """`count` episodes of `turns` sender turns in Qwen3.5's tokens, as a retrieval game writes them."""
    from emoji_rl.emoji.qwen_vocab import qwen_tokenizer

    tokenizer = qwen_tokenizer("qwen3.5")
    reply = "<|im_start|>assistant\n"
    opening = tuple(tokenizer.encode(_qwen_chat(sender_messages(TARGET)) + reply))
    correction = tuple(tokenizer.encode("\n" + _qwen_chat([correction_message(GUESS, TARGET)]) + reply))
    rng = random.Random(seed)
    episodes = []
    for _ in range(count):
        played = []
        for turn in range(turns):
            message = rng.choice(["", " "]).join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 8)))
            action = (*tokenizer.encode(message), tokenizer.im_end_id)
            result = StepResult(done=turn == turns - 1, reward=rng.random())
            played.append(Turn(opening if turn == 0 else correction, action, (0.0,) * len(action), result))
        episodes.append(Episode(tuple(played)))
    return episodes


def qwen_grammar() -> EmojiConstraint:
    from emoji_rl.emoji.constraint import compile_emoji_grammar_raw
    from emoji_rl.emoji.qwen_vocab import qwen_raw_vocab

    return compile_emoji_grammar_raw(qwen_raw_vocab("qwen3.5"))


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {field} line in /proc/self/status: the memory rows need Linux")


def peak_rss_above_now(work: Callable[[], object]) -> tuple[float, float]:
    """(peak RSS above the RSS before `work`, MB; seconds): the peak is reset first (clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")
    before = _rss_mb("VmRSS")
    start = time.perf_counter()
    work()
    return _rss_mb("VmHWM") - before, time.perf_counter() - start
