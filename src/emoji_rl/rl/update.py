"""One GRPO update: the step's episodes, split into micro-batches, give one clipped policy-gradient
step on the LoRA adapter with a KL to the reference, in the loss (k3) or in the advantages (k1 per
token, the original's: docs/SEED_RECIPE.md) (docs/DESIGN.md §6). The math is in `rl/grpo.py`; this is
where it meets the model, the micro-batches and the processes."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from emoji_rl.lm.distributed import gather
from emoji_rl.rl import grpo
from emoji_rl.rl.batch import Batch, token_logprobs
from emoji_rl.rl.policy import reference_mode

if TYPE_CHECKING:
    from accelerate import Accelerator


@dataclass(frozen=True)
class UpdateSettings:
    """What `update` reads, and nothing else: the stage's `Config.update_settings()` makes one."""

    loss_type: grpo.LossType
    clip_range: tuple[float, float]
    """(epsilon below 1, epsilon above 1) of the PPO clip."""
    beta: float
    """KL coefficient; 0: no KL, no reference pass."""
    kl_in: Literal["loss", "reward"]
    """Where the KL goes: k3 in the loss, or k1 per token subtracted from the advantages."""
    reference: Literal["init", "base"]
    """The KL reference: the starting adapter, frozen, or the base model (`reference_mode`)."""
    temperature: float
    """The sampler's, so that the log-probs are of the distribution it drew from."""
    micro_batch: int
    """Episodes per forward/backward pass (`per_device_train_batch_size`)."""
    max_tokens: int
    """Most sender tokens an episode can hold (max_new_tokens x max_turns): `dr_grpo`'s normalizer."""
    max_grad_norm: float
    """Gradient clipping norm; 0: no clipping."""
    gradient_checkpointing: bool
    """The policy recomputes its activations in the backward pass (no shared-prefix forward then)."""
    importance_weights: bool = False
    """Weigh each token by the truncated trainer/sampler probability ratio (a vLLM sampler)."""
    importance_sampling_cap: float = 2.0
    """Where that ratio is truncated (TRL's `vllm_importance_sampling_cap`)."""


def _size(batch: Batch, settings: UpdateSettings) -> float:
    """What the loss aggregate averages over: tokens (dapo; sum, for its metrics) or episodes."""
    return batch.mask_D_T.sum().item() if settings.loss_type in ("dapo", "sum") else float(batch.size)


def _shares(batch: Batch, settings: UpdateSettings, total: float) -> Iterator[tuple[Batch, float]]:
    """Micro-batches and the weight of each in the aggregate over `total` (`_size` of the whole step,
    on every process), so that accumulating micro-batch losses gives exactly the loss of the step."""
    for start in range(0, batch.size, settings.micro_batch):
        micro = batch.rows(start, start + settings.micro_batch)
        yield micro, _size(micro, settings) / total


def _reference_logprobs(
    settings: UpdateSettings,
    policy: torch.nn.Module,
    unwrapped: torch.nn.Module,
    micro: Batch,
    share_prefix: bool,
) -> torch.Tensor:
    with torch.no_grad(), reference_mode(unwrapped, settings.reference):
        return token_logprobs(policy, micro, settings.temperature, share_prefix)


def shares_prefix(settings: UpdateSettings, accelerator: Accelerator) -> bool:
    """Whether a micro-batch's shared opening runs once (`shared_prefix`): where that is allowed (one
    process, no activation checkpointing) and measured, on a CPU. A micro-batch of one group shares its
    whole prompt: 8 one-turn SmolLM2 episodes, ~64 of their ~74 tokens."""
    return (
        accelerator.num_processes == 1
        and accelerator.device.type == "cpu"
        and not settings.gradient_checkpointing
    )


def _kl_in_reward(
    settings: UpdateSettings,
    policy: torch.nn.Module,
    unwrapped: torch.nn.Module,
    micros: list[tuple[Batch, float]],
    share_prefix: bool,
) -> tuple[list[torch.Tensor], float]:
    """Per micro-batch, per-token advantages with the KL penalty, and the step's mean KL (its baseline,
    over every contributing process's sender tokens). Every process runs a reference pass for each of
    its micro-batches, padding included: under FSDP a forward pass is a collective."""
    kls = [
        grpo.k1_kl(
            micro.sampler_logp_D_T, _reference_logprobs(settings, policy, unwrapped, micro, share_prefix)
        )
        for micro, _ in micros
    ]
    sums = [
        (float((kl * micro.mask_D_T).sum()), float(micro.mask_D_T.sum())) if weight > 0 else (0.0, 0.0)
        for (micro, weight), kl in zip(micros, kls, strict=True)
    ]
    totals = gather((sum(s for s, _ in sums), sum(n for _, n in sums)))
    mean_kl = sum(s for s, _ in totals) / max(sum(n for _, n in totals), 1.0)
    advantages = [
        grpo.kl_penalized_advantages(micro.advantages_D, kl, micro.mask_D_T, settings.beta, mean_kl)
        for (micro, _), kl in zip(micros, kls, strict=True)
    ]
    return advantages, mean_kl


def update(
    settings: UpdateSettings,
    accelerator: Accelerator,
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    *,
    contributes: bool = True,
) -> dict[str, float]:
    """One clipped policy-gradient step over the whole step's batch, of which this process holds
    `batch`; returns the optimizer metrics of the whole step. A process whose groups all had zero
    spread passes `contributes=False` with any batch: it runs the passes at weight 0, as DDP and FSDP
    all-reduce gradients at every backward and so need as many on every process."""
    unwrapped = accelerator.unwrap_model(policy)
    sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "sampler_kl": 0.0}
    micro_size = settings.micro_batch
    counts = gather((_size(batch, settings) if contributes else 0.0, math.ceil(batch.size / micro_size)))
    total = sum(size for size, _ in counts)
    shares = [(micro, weight if contributes else 0.0) for micro, weight in _shares(batch, settings, total)]
    shares += [(batch.rows(0, micro_size), 0.0)] * (max(n for _, n in counts) - len(shares))
    shares = [(micro.to(accelerator.device), weight) for micro, weight in shares]
    share_prefix = shares_prefix(settings, accelerator)
    kl_in_loss = settings.beta > 0 and settings.kl_in == "loss"
    kl_in_reward = settings.beta > 0 and settings.kl_in == "reward"
    advantages = [micro.advantages_D for micro, _ in shares]
    mean_kl = 0.0
    if kl_in_reward:
        advantages, mean_kl = _kl_in_reward(settings, policy, unwrapped, shares, share_prefix)
    by_lag: dict[int, list[float]] = {}
    optimizer.zero_grad(set_to_none=True)
    for (micro, weight), advantage in zip(shares, advantages, strict=True):
        logp = token_logprobs(policy, micro, settings.temperature, share_prefix)
        old = logp.detach()
        behaviour = micro.sampler_logp_D_T if settings.importance_weights else None
        per_token, clipped, truncated = grpo.policy_loss(
            logp, behaviour, advantage, settings.clip_range, settings.importance_sampling_cap
        )
        if behaviour is not None and weight > 0:
            _count_by_lag(by_lag, micro, old, truncated)
        if kl_in_loss:
            kl = grpo.k3_kl(logp, _reference_logprobs(settings, policy, unwrapped, micro, share_prefix))
            per_token = per_token + settings.beta * kl
            sums["kl"] += weight * grpo.masked_mean(kl.detach(), micro.mask_D_T).item()
        # A sum counts every token once, whatever micro-batch holds it: the weight scales only the
        # metrics (and is 0 for a pass that must not count).
        scale = float(weight > 0) if settings.loss_type == "sum" else weight
        loss = grpo.aggregate(per_token, micro.mask_D_T, settings.loss_type, settings.max_tokens) * scale
        # The weights split the step's aggregate between the processes; DDP and FSDP average the
        # processes' gradients, so each contributes its part times their number.
        accelerator.backward(loss * accelerator.num_processes)
        sums["loss"] += loss.item()
        sums["clip_frac"] += weight * grpo.masked_mean(clipped, micro.mask_D_T).item()
        sums["sampler_kl"] += weight * grpo.masked_mean(micro.sampler_logp_D_T - old, micro.mask_D_T).item()
    parts = gather((sums, by_lag))
    sums = {key: sum(part[key] for part, _ in parts) for key in sums}
    if kl_in_reward:
        sums["kl"] = mean_kl  # already the whole step's
    params = [p for p in policy.parameters() if p.requires_grad]
    # An infinite norm clips nothing and still measures the gradient, which the non-finite check needs.
    grad_norm = float(accelerator.clip_grad_norm_(params, settings.max_grad_norm or math.inf))
    return {
        **{f"optim/{k}": v for k, v in sums.items() if k != "sampler_kl"},
        "sampler/kl_vs_trainer": sums["sampler_kl"],
        "optim/grad_norm": grad_norm,
        **lag_metrics([lags for _, lags in parts]),
    }


def _count_by_lag(
    by_lag: dict[int, list[float]], micro: Batch, trainer_logp: torch.Tensor, truncated: torch.Tensor
) -> None:
    """Add a micro-batch's sender tokens to `by_lag`: per version lag, [tokens, truncated, sum of
    |log ratio|, sum of sampler minus trainer log-prob]."""
    lags = micro.lag_D_T if micro.lag_D_T is not None else torch.zeros_like(micro.mask_D_T, dtype=torch.long)
    gap = micro.sampler_logp_D_T - trainer_logp
    for lag in lags[micro.mask_D_T].unique().tolist():
        tokens = micro.mask_D_T & (lags == lag)
        sums = by_lag.setdefault(int(lag), [0.0, 0.0, 0.0, 0.0])
        sums[0] += float(tokens.sum())
        sums[1] += float(truncated[tokens].sum())
        sums[2] += float(gap[tokens].abs().sum())
        sums[3] += float(gap[tokens].sum())


def lag_metrics(parts: list[dict[int, list[float]]]) -> dict[str, float]:
    """Per version lag L over every process's tokens (`_count_by_lag`): `sampler/lagL/tokens`, the
    fraction whose importance weight was truncated, the mean |log(p_trainer / p_sampler)| and
    `kl_vs_trainer` (the mean of log p_sampler - log p_trainer, as `sampler/kl_vs_trainer` is)."""
    totals: dict[int, list[float]] = {}
    for part in parts:
        for lag, sums in part.items():
            totals[lag] = [a + b for a, b in zip(totals.get(lag, [0.0] * 4), sums, strict=True)]
    metrics = {}
    for lag, (tokens, truncated, abs_gap, gap) in sorted(totals.items()):
        metrics[f"sampler/lag{lag}/tokens"] = tokens
        metrics[f"sampler/lag{lag}/truncated"] = truncated / tokens
        metrics[f"sampler/lag{lag}/log_ratio_abs"] = abs_gap / tokens
        metrics[f"sampler/lag{lag}/kl_vs_trainer"] = gap / tokens
    return metrics
