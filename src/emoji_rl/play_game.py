"""`emoji-rl play-game`: play the retrieval game against the model, as the sender or as the judge.

As the sender you see what the model sees (the message, then the judge's guesses) and type emoji;
the judge guesses. As the judge you see the model's emoji and type your guess. Each turn prints
the similarity; the game ends at tau or after `max_turns`, with the reward the trainer would give.

    emoji-rl play-game --role sender --judge hf
    emoji-rl play-game --role judge --adapter runs/grpo/adapter
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.sampler import HFSampler, Sample
from emoji_rl.emoji.alphabet import MAX_EMOJI, MIN_EMOJI, parse_message
from emoji_rl.games.retrieval.game import RetrievalBuilder, RetrievalConfig, RetrievalRules
from emoji_rl.io.jsonl import read_jsonl
from emoji_rl.lm import models
from emoji_rl.lm.template import stop_token_id
from emoji_rl.play.guessing import Guess, JudgeInput, clean_guess, render_turn
from emoji_rl.play.judge import Judge
from emoji_rl.play.judge_config import JudgeConfig
from emoji_rl.play.loop import play
from emoji_rl.play.similarity import load_similarity


@dataclass
class Config(JudgeConfig, RetrievalConfig, models.ModelConfig):
    """Play the retrieval game against the model (the judge_* fields: role sender)."""

    role: Literal["sender", "judge"] = field(default="sender", metadata={"help": "the part you play"})
    target: str | None = field(
        default=None, metadata={"help": "the message; default: a random one from data"}
    )
    data: str = field(default="data/rl_eval.jsonl", metadata={"help": "where random messages come from"})
    adapter: str | None = field(default=None, metadata={"help": "sender adapter (role judge)"})
    temperature: float = field(default=1.0, metadata={"help": "model sampling temperature", "min": 0.0})
    seed: int = field(default=0, metadata={"help": "seed for the random message and sampling"})


class HumanSender:
    """A sampler that shows each new observation and reads emoji from the terminal."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.seen = 0

    async def sample(
        self, prompts: Sequence[tuple[int, ...]], previous: Sequence[Sample | None] | None = None
    ) -> list[Sample]:
        (prompt,) = prompts
        print("\n" + self.tokenizer.decode(prompt[self.seen :], skip_special_tokens=True).strip())
        while True:
            text = input("your emoji> ").strip()
            parsed = parse_message(text, MIN_EMOJI, MAX_EMOJI)
            if parsed.ok:
                break
            print(f"  not a valid emoji message: {parsed.reason}")
        ids = (*self.tokenizer(text, add_special_tokens=False)["input_ids"], stop_token_id(self.tokenizer))
        self.seen = len(prompt) + len(ids)
        return [Sample(tuple(ids), tuple(0.0 for _ in ids))]


class HumanJudge(Judge):
    """A judge that shows the emoji turns and reads a guess from the terminal."""

    async def guess(self, episodes: Sequence[JudgeInput]) -> list[Guess]:
        (episode,) = episodes
        print(f"\nthe sender says: {render_turn(episode.turns[-1], 'raw')}")
        return [clean_guess(input("your guess> "))]

    def describe(self) -> str:
        return "human"


def pick_target(cfg: Config) -> str:
    if cfg.target:
        return cfg.target
    if not Path(cfg.data).is_file():
        return input("message to play with> ").strip()
    records = read_jsonl(cfg.data)
    return random.Random(cfg.seed).choice(records)["target"]


def main(cfg: Config) -> None:
    runtime = models.pick_runtime()
    similarity = load_similarity(runtime=runtime)
    tokenizer = models.load_tokenizer(cfg.model)
    if cfg.role == "sender":
        judge: Judge = cfg.build_judge(runtime)
        sampler = HumanSender(tokenizer)
    else:
        judge = HumanJudge()
        sender = models.load_causal_lm(cfg.model, runtime, adapter=cfg.adapter)
        sampler = HFSampler(sender, tokenizer, Decoding(temperature=cfg.temperature))
    rules = RetrievalRules(max_turns=cfg.max_turns, tau=cfg.tau)
    builder = RetrievalBuilder(tokenizer, judge, similarity, rules)
    target = pick_target(cfg)
    print(f"playing as the {cfg.role} against {judge.describe() if cfg.role == 'sender' else cfg.model}")
    [episode] = asyncio.run(play([builder({"target": target})], sampler))
    print()
    for t, turn in enumerate(episode.turns, start=1):
        log, metrics = turn.result.log, turn.result.metrics
        print(
            f"turn {t}: {log.get('emoji', '')}  ->  {log.get('guess', '-')}  (similarity {metrics['similarity']:.3f})"
        )
    print(f"\nthe message was: {target}\nreward: {episode.reward:+.3f}")
