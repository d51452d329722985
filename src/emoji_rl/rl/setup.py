"""The wiring of a GRPO run: which sampler plays the game, in-process or a vLLM server kept current by
an adapter sync. The loop in `rl/train.py` receives what is built here and knows no engine; the game
comes from the registry (`game/registry.py`), and when each step is played is the schedule's
(`rl/rollout/schedule.py`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from emoji_rl.decode.generate import Constraint
from emoji_rl.lm import template

if TYPE_CHECKING:
    from peft import PeftModel

    from emoji_rl.decode.sampler import Sampler
    from emoji_rl.rl.rollout.vllm import AdapterSync
    from emoji_rl.rl.train_config import TrainConfig


def build_sampler(
    cfg: TrainConfig, policy: PeftModel, tokenizer, constraint: Constraint
) -> tuple[Sampler, AdapterSync | None]:
    """The in-process sampler, or a vLLM server's with the adapter sync that keeps it current."""
    if cfg.engine == "hf":
        from emoji_rl.decode.sampler import HFSampler

        decoding = cfg.decoding(constraint=constraint, batch_size=cfg.batch_size * cfg.group_size)
        return HFSampler(policy, tokenizer, decoding), None
    from emoji_rl.decode.vllm import VLLMSampler
    from emoji_rl.io.endpoint import Endpoint
    from emoji_rl.rl.rollout.vllm import AdapterSync

    wait_for_policy_server(cfg)
    endpoint = Endpoint(cfg.vllm_url, cfg.vllm_api_key_env, cfg.vllm_timeout_s)
    sampler = VLLMSampler(
        endpoint,
        cfg.vllm_served_name,
        template.stop_token_id(tokenizer),
        cfg.decoding(constraint=constraint),
        padding=template.padding_ids(tokenizer, policy.get_output_embeddings().weight.shape[0]),
    )
    asyncio.run(sampler.verify())
    return sampler, AdapterSync(sampler, cfg.output_dir, cfg.vllm_served_name, cfg.vllm_adapter_keep)


def wait_for_policy_server(cfg: TrainConfig) -> None:
    """Wait for the policy server `--engine vllm` samples on (`vllm_url`); the stage does it before any
    model loads, so that a server that is not there costs no model load."""
    from emoji_rl.io.endpoint import wait_for_server

    wait_for_server(
        cfg.vllm_url,
        "the policy server",
        cfg.server_wait_s,
        "start it with make serve-policy (launch/serve_policy.sh; --dry-run prints its vllm serve command, "
        "POLICY_HOST and POLICY_PORT), or point --vllm_url at the one running",
    )
