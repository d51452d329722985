"""How a GRPO run's rollouts are sampled (`engine`: hf | vllm): in process, by the weights being
trained, or on a vLLM server that an adapter sync keeps current. The loop in `rl/train.py` receives
the `Engine` built here and asks it only `on_server`; the game comes from the registry
(`play/registry.py`), and when each step is played is the schedule's (`rl/rollout/schedule.py`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emoji_rl.decode.generate import Constraint
from emoji_rl.lm import template

if TYPE_CHECKING:
    from peft import PeftModel

    from emoji_rl.decode.sampler import Sampler
    from emoji_rl.rl.rollout.vllm import AdapterSync
    from emoji_rl.rl.train_config import TrainConfig


@dataclass(frozen=True)
class Engine:
    """The run's sampler, and on a vLLM server the adapter sync that publishes each version to it."""

    sampler: Sampler
    sync: AdapterSync | None = None

    @property
    def on_server(self) -> bool:
        """Sampled on a vLLM server, by published adapter versions (else in process, by the weights
        being trained, which cannot run ahead of them)."""
        return self.sync is not None


def build_engine(cfg: TrainConfig, policy: PeftModel, tokenizer, constraint: Constraint) -> Engine:
    """The in-process sampler, or a vLLM server's with the adapter sync that keeps it current."""
    if cfg.engine == "hf":
        from emoji_rl.decode.sampler import HFSampler

        decoding = cfg.decoding(constraint=constraint, batch_size=cfg.batch_size * cfg.group_size)
        return Engine(HFSampler(policy, tokenizer, decoding))
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
    return Engine(sampler, AdapterSync(sampler, cfg.output_dir, cfg.vllm_served_name, cfg.vllm_adapter_keep))


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
