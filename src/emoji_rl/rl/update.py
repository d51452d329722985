"""One GRPO update: the step's episodes, split into micro-batches, give one clipped policy-gradient
step on the LoRA adapter with a k3 KL to the reference (docs/DESIGN.md §6). The math is in `rl/grpo.py`;
this is where it meets the model, the micro-batches and the processes."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from emoji_rl.rl import grpo
from emoji_rl.rl.batch import Batch, token_logprobs
from emoji_rl.rl.distributed import gather
from emoji_rl.rl.policy import reference_mode

if TYPE_CHECKING:
    from accelerate import Accelerator

    from emoji_rl.rl.train_config import Config


def _size(batch: Batch, cfg: Config) -> float:
    """What the loss aggregate averages over: tokens (token_mean) or episodes."""
    return batch.mask_D_T.sum().item() if cfg.aggregation == "token_mean" else float(batch.size)


def _shares(batch: Batch, cfg: Config, total: float) -> Iterator[tuple[Batch, float]]:
    """Micro-batches and the weight of each in the aggregate over `total` (`_size` of the whole step,
    on every process), so that accumulating micro-batch losses gives exactly the loss of the step."""
    for start in range(0, batch.size, cfg.per_device_train_batch_size):
        micro = batch.rows(start, start + cfg.per_device_train_batch_size)
        yield micro, _size(micro, cfg) / total


def update(
    cfg: Config,
    accelerator: Accelerator,
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    use_importance_weights: bool,
    contributes: bool = True,
) -> dict[str, float]:
    """One clipped policy-gradient step over the whole step's batch, of which this process holds
    `batch`; returns the optimizer metrics of the whole step. A process whose groups all had zero
    spread passes `contributes=False` with any batch: it runs the passes at weight 0, as DDP and FSDP
    all-reduce gradients at every backward and so need as many on every process."""
    unwrapped = accelerator.unwrap_model(policy)
    sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "sampler_kl": 0.0}
    max_tokens = cfg.max_new_tokens * cfg.max_turns
    micro_size = cfg.per_device_train_batch_size
    counts = gather((_size(batch, cfg) if contributes else 0.0, math.ceil(batch.size / micro_size)))
    total = sum(size for size, _ in counts)
    shares = [(micro, weight if contributes else 0.0) for micro, weight in _shares(batch, cfg, total)]
    shares += [(batch.rows(0, micro_size), 0.0)] * (max(n for _, n in counts) - len(shares))
    optimizer.zero_grad(set_to_none=True)
    for micro, weight in shares:
        micro = micro.to(accelerator.device)
        logp = token_logprobs(policy, micro, cfg.temperature)
        # One update per batch: the policy that sampled is the policy being updated, so the old
        # log-probs are the current ones, detached (ratio 1, gradient of the ratio intact).
        old = logp.detach()
        pg_loss, clipped = grpo.ppo_clip_loss(logp, old, micro.advantages_D, cfg.eps_low, cfg.eps_high)
        if use_importance_weights:
            pg_loss = pg_loss * grpo.truncated_importance_weights(old, micro.sampler_logp_D_T)
        per_token = pg_loss
        if cfg.beta > 0:
            with torch.no_grad(), reference_mode(unwrapped, cfg.reference):
                ref = token_logprobs(policy, micro, cfg.temperature)
            kl = grpo.k3_kl(logp, ref)
            per_token = per_token + cfg.beta * kl
            sums["kl"] += weight * grpo.masked_mean(kl.detach(), micro.mask_D_T).item()
        loss = grpo.aggregate(per_token, micro.mask_D_T, cfg.aggregation, max_tokens) * weight
        # The weights split the step's aggregate between the processes; DDP and FSDP average the
        # processes' gradients, so each contributes its part times their number.
        accelerator.backward(loss * accelerator.num_processes)
        sums["loss"] += loss.item()
        sums["clip_frac"] += weight * grpo.masked_mean(clipped, micro.mask_D_T).item()
        sums["sampler_kl"] += weight * grpo.masked_mean(micro.sampler_logp_D_T - old, micro.mask_D_T).item()
    sums = {key: sum(part[key] for part in gather(sums)) for key in sums}
    params = [p for p in policy.parameters() if p.requires_grad]
    grad_norm = float(accelerator.clip_grad_norm_(params, cfg.max_grad_norm))
    return {
        **{f"optim/{k}": v for k, v in sums.items() if k != "sampler_kl"},
        "sampler/kl_vs_trainer": sums["sampler_kl"],
        "optim/grad_norm": grad_norm,
    }
