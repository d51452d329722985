"""The wiring of a GRPO run: which sampler plays the game (in-process, or a vLLM server kept current by
an adapter sync), and how each step's rollouts are played (in the loop's thread, or ahead of it on a
thread of their own). The loop in `rl/train.py` receives what is built here and knows no engine; the
game comes from the registry (`game/registry.py`)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from emoji_rl.decode.generate import Constraint
from emoji_rl.lm import template
from emoji_rl.lm.training import gather
from emoji_rl.rl.checkpoint import TrainState, behaviour_adapters
from emoji_rl.rl.rollout.collect import PromptStream, collect
from emoji_rl.rl.rollout.overlap import Played, RolloutsAhead

if TYPE_CHECKING:
    from peft import PeftModel

    from emoji_rl.decode.sampler import Sampler
    from emoji_rl.game.types import GameSetup
    from emoji_rl.rl.rollout.vllm import AdapterSync
    from emoji_rl.rl.train_config import TrainConfig


def build_sampler(
    cfg: TrainConfig, policy: PeftModel, tokenizer, constraint: Constraint
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
    cfg: TrainConfig,
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
        played = await collect(stream, game, bound, share, cfg.group_size, cfg.scale_rewards, rounds)
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
