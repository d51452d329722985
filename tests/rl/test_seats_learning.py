"""Two seats checked by learning (docs/DESIGN.md §14): one LoRA adapter plays a sender seat under the
emoji grammar and a reader seat in free text, each with a verifiable reward of its own, trained
together in one update a step by the GRPO loop itself; both rewards rise, measured on fresh episodes
before and after. The rewards are verifiable so that two steps show it; the both_seats game's own
judge and similarity are what tests/games/both_seats checks."""

import asyncio

import pytest
import torch

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.sampler import HFSampler
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.io.metrics import read_metrics
from emoji_rl.lm import models
from emoji_rl.play.chat import Chat
from emoji_rl.play.loop import play
from emoji_rl.play.types import Env, GameSetup, Seat, StepResult
from emoji_rl.rl import train as grpo_train
from emoji_rl.rl.policy import build_policy
from emoji_rl.rl.train_config import grpo_config

pytestmark = pytest.mark.slow

SENDER, READER = Seat("sender", "grammar"), Seat("reader", "none")
FAVORITE = "🌱"
QUESTION = "Here are emoji: {emoji}. Do they show food? Answer yes or no."


class SendAndAnswer(Env):
    """The sender writes up to 4 emoji (rewarded their share of FAVORITE); the reader is shown them
    and asked a question in a chat of its own (rewarded 1 for an answer that opens with "no")."""

    def __init__(self, tokenizer):
        self.sender = Chat(tokenizer, sender_messages("I love the sunny weather today"))
        self.tokenizer = tokenizer

    async def start(self):
        self.seat = SENDER
        return self.sender.opening_ids()

    async def step(self, action_ids):
        if self.seat is SENDER:
            text, ended = self.sender.read(action_ids)
            parsed = parse_message(text, 2, 4)
            self.share = parsed.emoji.count(FAVORITE) / len(parsed.emoji) if ended and parsed.ok else 0.0
            self.seat = READER
            self.reader = Chat(self.tokenizer, [{"role": "user", "content": QUESTION.format(emoji=text)}])
            return StepResult(False, 0.0, self.reader.opening_ids())
        text, _ = self.reader.read(action_ids)
        no = float(text.strip().lower().startswith("no"))
        rewards = {"sender": self.share, "reader": no}
        return StepResult(True, self.share, seat_rewards=rewards, metrics={"share": self.share, "no": no})


def _means(tokenizer, sampler, n=12, seed=123):
    torch.manual_seed(seed)
    episodes = asyncio.run(play([SendAndAnswer(tokenizer) for _ in range(n)], sampler))
    return tuple(sum(e.rewards[seat] for e in episodes) / n for seat in ("sender", "reader"))


def test_both_seats_rewards_rise_in_one_adapter(tmp_path):
    cfg = grpo_config(
        output_dir=str(tmp_path / "run"),
        batch_size=1,
        group_size=8,
        max_emoji=4,
        max_new_tokens=16,  # as tests/rl/test_train.py: at 12 the sender scored 0 in every group, cut off
        learning_rate=2e-3,
        beta=0.0,
        lora_r=8,
        lora_alpha=16,
        max_steps=2,
        save_steps=100,
        per_device_train_batch_size=16,
        seed=0,
    )
    torch.manual_seed(cfg.seed)  # the fresh LoRA adapter's initialization
    tokenizer = models.load_tokenizer(models.SMOLLM2)
    policy = build_policy(cfg.model, models.pick_runtime("cpu"), None, None, cfg.lora_r, cfg.lora_alpha)
    decoding = Decoding(max_new_tokens=cfg.max_new_tokens, batch_size=32, max_emoji=cfg.max_emoji)
    sampler = HFSampler(policy, tokenizer, decoding)
    before = _means(tokenizer, sampler)
    setup = GameSetup(lambda r: SendAndAnswer(tokenizer), [{"id": "p0"}], (SENDER, READER), "send and answer")
    grpo_train.train(cfg, policy, tokenizer, setup, sampler)
    after = _means(tokenizer, sampler)
    print(f"sender's share of {FAVORITE}, reader's 'no': before {before}, after {after}")
    assert after[0] > before[0] + 0.1 and after[1] > before[1] + 0.15
    metrics = read_metrics(cfg.output_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    assert {"reward/sender/mean", "reward/reader/mean", "group/sender/kept", "game/no"} <= set(metrics[0])
