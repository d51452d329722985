"""The wiring of a GRPO run: which game it plays (records, judge, embedder, constraint, curriculum),
which sampler plays it (in-process, or a vLLM server kept current by an adapter sync), and how each
step's rollouts are played (in the loop's thread, or ahead of it on a thread of their own). The loop
in `rl/train.py` receives what is built here and knows no game or engine."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from emoji_rl.decode.generate import Constraint
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import read_jsonl
from emoji_rl.lm import models, template
from emoji_rl.lm.training import gather
from emoji_rl.rl.checkpoint import TrainState, behaviour_adapters
from emoji_rl.rl.rollout.collect import PromptStream, collect
from emoji_rl.rl.rollout.overlap import Played, RolloutsAhead

if TYPE_CHECKING:
    from peft import PeftModel

    from emoji_rl.decode.sampler import Sampler
    from emoji_rl.emoji.constraint import EmojiConstraint
    from emoji_rl.game.types import EpisodeGroup, Game
    from emoji_rl.rl.checkpoint import Stateful
    from emoji_rl.rl.rollout.vllm import AdapterSync
    from emoji_rl.rl.train_config import Config


@dataclass
class GameSetup:
    """What the loop needs of a game: a builder of games, the records it reads, the constraint the
    sender samples under (None: free text), the seconds spent in its services since the start, any
    state of the run beyond the model that a checkpoint must hold (the Wordle curriculum), and what
    learns from each step's groups, every process's, in rank order (the curriculum again): fed the
    same groups on every process, the processes take the same decisions."""

    make_game: Callable[[dict[str, str]], Game]
    records: list[dict[str, str]]
    constraint: EmojiConstraint | None
    description: str
    seconds: Callable[[], dict[str, float]] = dict
    state: Stateful | None = None
    observe: Callable[[Sequence[EpisodeGroup]], None] = lambda groups: None


def read_records(path: str, key: str, hint: str) -> list[dict[str, str]]:
    """The training records, each with a non-empty string `key` (checked here, before any model loads)."""
    records = read_jsonl(path, hint=hint)
    for number, record in enumerate(records, start=1):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise UserError(f"{path}:{number}: record has no non-empty string `{key}`")
    return records


def retrieval_setup(cfg: Config, tokenizer, runtime: models.Runtime, vocab_size: int) -> GameSetup:
    from emoji_rl.emoji.constraint import compile_emoji_grammar
    from emoji_rl.game.retrieval import RetrievalBuilder, RetrievalRules
    from emoji_rl.game.reward import Background, RewardWeights, Similarity

    records = read_records(cfg.train_data, "target", "make it with `emoji-rl rl-prompts`")
    constraint = compile_emoji_grammar(tokenizer, cfg.min_emoji, cfg.max_emoji, vocab_size=vocab_size)
    judge = cfg.build_judge(runtime)
    similarity = Similarity(models.load_embedder(cfg.similarity_model, device=runtime.device))
    weights = RewardWeights(
        cfg.success_bonus, cfg.turn_cost, cfg.format_penalty, cfg.repetition_penalty, cfg.contrast
    )
    rules = RetrievalRules(cfg.max_turns, cfg.tau, cfg.min_emoji, cfg.max_emoji, weights)
    background = None
    if cfg.contrast > 0:
        targets = [r["target"] for r in records]
        sample = random.Random(cfg.seed).sample(targets, min(cfg.contrast_messages, len(targets)))
        background = Background(similarity, sample)
    builder = RetrievalBuilder(tokenizer, judge, similarity, rules, background)
    return GameSetup(
        builder,
        records,
        constraint,
        f"retrieval, judge {judge.describe()}",
        seconds=lambda: dict(builder.seconds),
    )


def wordle_setup(cfg: Config, tokenizer) -> GameSetup:
    from emoji_rl.game.wordle import WordleBuilder, WordleRules
    from emoji_rl.game.wordle_reward import Curriculum, CurriculumTracker

    records = read_records(cfg.train_data, "answer", "make it with `emoji-rl wordle-data`")
    tracker = (
        CurriculumTracker(Curriculum(threshold=cfg.curriculum_threshold, window=cfg.curriculum_window))
        if cfg.curriculum
        else None
    )
    builder = WordleBuilder(tokenizer, WordleRules(max_turns=cfg.max_turns), tracker)
    description = "wordle" + (" with curriculum" if tracker else "")
    if tracker is None:
        return GameSetup(builder, records, None, description)

    def observe(groups: Sequence[EpisodeGroup]) -> None:
        for group in groups:
            for episode in group.episodes:
                tracker.record(episode.turns[-1].result.metrics["format_rate"])

    return GameSetup(builder, records, None, description, state=tracker, observe=observe)


def build_sampler(
    cfg: Config, policy: PeftModel, tokenizer, constraint: Constraint
) -> tuple[Sampler, AdapterSync | None]:
    """The in-process sampler, or a vLLM server's with the adapter sync that keeps it current."""
    from emoji_rl.decode.sampler import HFSampler

    if cfg.engine == "hf":
        sampler = HFSampler(
            policy,
            tokenizer,
            constraint,
            cfg.temperature,
            cfg.max_new_tokens,
            cfg.batch_size * cfg.group_size,
            cfg.min_emoji,
            cfg.max_emoji,
        )
        return sampler, None
    from emoji_rl.io.endpoint import Endpoint, wait_for_server
    from emoji_rl.rl.rollout.vllm import AdapterSync, VLLMSampler

    wait_for_server(
        cfg.vllm_url,
        "the policy server",
        cfg.server_wait_s,
        "start it with make serve-policy (launch/serve_policy.sh; --dry-run prints its vllm serve command, "
        "POLICY_HOST and POLICY_PORT), or point --vllm_url at the one running",
    )
    endpoint = Endpoint(cfg.vllm_url, cfg.vllm_api_key_env, cfg.vllm_timeout_s)
    sampler = VLLMSampler(
        endpoint,
        cfg.vllm_served_name,
        template.stop_token_id(tokenizer),
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        min_emoji=cfg.min_emoji,
        max_emoji=cfg.max_emoji,
        grammar=constraint == "grammar",
        padding=template.padding_ids(tokenizer, policy.get_output_embeddings().weight.shape[0]),
    )
    asyncio.run(sampler.verify())
    return sampler, AdapterSync(sampler, cfg.output_dir, cfg.vllm_served_name, cfg.vllm_adapter_keep)


def rollouts_ahead(
    cfg: Config,
    game: GameSetup,
    sampler: Sampler,
    weight_sync: AdapterSync | None,
    state: TrainState,
    rank: int,
    share: int,
    checkpoint: Path | None,
) -> RolloutsAhead:
    """Steps `state.step` on, played in-process or, with a vLLM server, on a thread by the version K
    behind, from a prompt stream of their own that starts where the checkpoint's stopped."""
    background = weight_sync is not None
    # The thread's prompt draws are a collective among the processes: on a group of their own, so
    # that they never interleave with the update's.
    group = rollout_group(cfg.collective_timeout_s) if background else None
    stream = PromptStream(
        game.records, cfg.seed, replace(state), rank, gather_counts=lambda n: gather(n, group)
    )
    rounds = cfg.max_resample_rounds if cfg.dynamic_sampling else 0
    if background:
        from emoji_rl.rl.rollout.vllm import request_seed

    async def play(step: int, version: int, name: str | None) -> Played:
        # On a server, each step's requests are seeded from (seed, rank, step): what a step samples
        # does not depend on what ran before it, so a resume redraws a lost step exactly.
        bound = sampler if name is None else sampler.at(version, name, request_seed(cfg.seed, rank, step))
        stream.state.step = step  # the stream's own copy of the state: the step it draws for
        before = game.seconds()
        played = await collect(
            stream, game.make_game, bound, share, cfg.group_size, cfg.scale_rewards, rounds
        )
        services = {k: v - before.get(k, 0.0) for k, v in game.seconds().items()}
        return Played(step, version, played, services, (stream.state.epoch, stream.state.cursor))

    kept = behaviour_adapters(checkpoint) if checkpoint is not None and background else {}
    return RolloutsAhead(
        play,
        state.step,
        cfg.max_steps,
        cfg.max_off_policy_steps,
        first_version=min(kept, default=state.step),
        background=background,
    )


def rollout_group(timeout_s: int):
    """A gloo process group for the rollout thread's collectives, which wait `timeout_s` for a peer as
    the run's own group does (gloo's default is 30 minutes); None with one process."""
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return None
