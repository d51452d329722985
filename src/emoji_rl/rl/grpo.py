"""GRPO math as plain functions from tensors to tensors: no model, no I/O, no config.

Shape suffixes (tinker's notation): `_P` prompts (groups), `_G` rollouts of one prompt, `_D` flattened
rows (one episode's seat each), `_T` token positions, `_V` vocabulary. `mask_D_T` is 1 on tokens the
policy produced (the loss runs over these only) and 0 on prompts, observations and padding. Where the
policy plays several seats of a game, a group is one prompt's G episodes seen from one seat, and every
baseline is that seat's alone (docs/DESIGN.md §14).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch

from emoji_rl.lm.models import at_least_fp32

# The values of TRL's GRPOConfig `scale_rewards` and `loss_type`, where they mean the same thing; `sum`
# is the original's loss (docs/SEED_RECIPE.md).
ScaleRewards = Literal["group", "batch", "none"]
LossType = Literal["dapo", "grpo", "dr_grpo", "sum"]
# What a seat's reward is measured against: its group's mean (GRPO) or the seat's moving average over
# the steps (SPIRAL's role-conditioned baseline).
Baseline = Literal["group", "ema"]


def group_advantages(
    rewards_P_G: torch.Tensor, scale_rewards: ScaleRewards = "group", eps: float = 1e-6
) -> torch.Tensor:
    """Reward minus its group's mean, optionally divided by a standard deviation.

    `group` divides by each group's std (GRPO), `batch` by the std of the whole batch (more stable
    when groups are small), `none` not at all (Dr. GRPO: std scaling favours easy and hard prompts; the
    original's recipe). The std is the sample std (n-1), as TRL computes it.
    """
    if rewards_P_G.ndim != 2 or rewards_P_G.shape[1] < 2:
        raise ValueError(
            f"rewards must be [prompts, group] with group >= 2, got shape {tuple(rewards_P_G.shape)}: "
            "the advantage is reward minus the group mean"
        )
    centered_P_G = rewards_P_G - rewards_P_G.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        return centered_P_G / (rewards_P_G.std(dim=1, keepdim=True) + eps)
    if scale_rewards == "batch":
        return centered_P_G / (rewards_P_G.std() + eps)
    return centered_P_G


def zero_spread_groups(rewards_P_G: torch.Tensor, tol: float = 1e-8) -> torch.Tensor:
    """True for groups whose rewards are all equal: their advantages are 0, they carry no signal."""
    return (rewards_P_G.max(dim=1).values - rewards_P_G.min(dim=1).values) <= tol


def step_advantages(
    rewards: Sequence[Sequence[float]], scale_rewards: ScaleRewards
) -> list[tuple[float, ...]]:
    """Each of a step's groups' advantages (`rewards`: one row per group played by this process), as
    the update trains on them: `group_advantages` in one call over the groups with reward spread (the
    kept ones; under `batch`, the std is theirs together), and zeros for the others, which carry no
    signal."""
    if not rewards:
        return []
    rewards_P_G = torch.tensor(rewards, dtype=torch.float)
    kept_P = ~zero_spread_groups(rewards_P_G)
    advantages_P_G = torch.zeros_like(rewards_P_G)
    if kept_P.any():
        advantages_P_G[kept_P] = group_advantages(rewards_P_G[kept_P], scale_rewards)
    return [tuple(row) for row in advantages_P_G.tolist()]


def seat_advantages(
    rewards: Sequence[Sequence[float]], seats: Sequence[str], scale_rewards: ScaleRewards
) -> list[tuple[float, ...]]:
    """`step_advantages` over each seat's groups apart (`seats[p]`: group p's seat): under `batch` the
    std is the seat's own, so one seat's reward scale never scales the other's advantages. One seat:
    `step_advantages` itself."""
    advantages: list[tuple[float, ...]] = [()] * len(rewards)
    for seat in dict.fromkeys(seats):
        rows = [p for p, s in enumerate(seats) if s == seat]
        for p, row in zip(rows, step_advantages([rewards[p] for p in rows], scale_rewards), strict=True):
            advantages[p] = row
    return advantages


def ema_baselines(
    baselines: dict[str, float], means: dict[str, float], decay: float
) -> tuple[dict[str, float], dict[str, float]]:
    """(the baseline each seat's rewards of this step are measured against, the baselines after it):
    a seat's moving average b of its steps' mean rewards m, b <- decay * b + (1 - decay) * m, taken
    after its step's advantages, so a reward never enters its own baseline. A seat with none yet is
    measured against its step's mean, which then starts its average."""
    used = {seat: baselines.get(seat, mean) for seat, mean in means.items()}
    after = {**baselines, **{seat: decay * used[seat] + (1 - decay) * m for seat, m in means.items()}}
    return used, after


def ema_advantages(
    rewards: Sequence[Sequence[float]],
    seats: Sequence[str],
    baselines: dict[str, float],
    scale_rewards: ScaleRewards,
    eps: float = 1e-6,
) -> list[tuple[float, ...]]:
    """Each reward minus its seat's baseline (`ema_baselines`), divided under `batch` by the std of
    that seat's rewards in this step (n-1, as `group_advantages`; none where they are all equal, which
    would blow the advantages up), under `none` by nothing. A group
    whose rewards are all equal still carries signal: how far it stands from the seat's average. No
    `group` scaling: the std of such a group is 0."""
    if scale_rewards == "group":
        raise ValueError("a moving baseline takes scale_rewards batch or none: a flat group's std is 0")
    advantages: list[tuple[float, ...]] = [()] * len(rewards)
    for seat in dict.fromkeys(seats):
        rows = [p for p, s in enumerate(seats) if s == seat]
        rewards_P_G = torch.tensor([rewards[p] for p in rows], dtype=torch.float)
        centered_P_G = rewards_P_G - baselines[seat]
        spread = rewards_P_G.std().item() if rewards_P_G.numel() > 1 else 0.0
        if scale_rewards == "batch" and spread > 1e-8:  # a seat whose whole step was flat: unscaled
            centered_P_G = centered_P_G / (spread + eps)
        for p, row in zip(rows, centered_P_G.tolist(), strict=True):
            advantages[p] = tuple(row)
    return advantages


def masked_token_logprobs(
    logits_D_T_V: torch.Tensor,
    allowed_D_T_V: torch.Tensor | None,
    targets_D_T: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probs of `targets` under the distribution the sampler drew from.

    Disallowed tokens go to -inf before the log-softmax, so the probabilities are renormalized over
    what the grammar allowed: otherwise the ratio and the KL compare two different distributions.
    `logits_D_T_V[:, t]` must be the logits that predicted `targets_D_T[:, t]`.
    """
    scaled = at_least_fp32(logits_D_T_V) / temperature
    if allowed_D_T_V is not None:
        scaled = scaled.masked_fill(~allowed_D_T_V, float("-inf"))
    logp_D_T_V = scaled.log_softmax(dim=-1)
    return logp_D_T_V.gather(-1, targets_D_T.unsqueeze(-1)).squeeze(-1)


def head_token_logprobs(
    hidden_N_H: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    targets_N: torch.Tensor,
    temperature: float = 1.0,
    rows: int = 256,
) -> torch.Tensor:
    """`masked_token_logprobs` with no mask, of `head(hidden_N_H)`'s logits, `rows` positions at a
    time. With a gradient, each chunk's logits are recomputed in the backward pass instead of kept
    (activation checkpointing): at most one chunk's [rows, V] logits and their fp32 copies exist at
    once, not the whole [N, V] (six turns of 1,024 tokens: N up to 6,144 x Qwen3.5's 248,320 is 6 GB per fp32 copy;
    a chunk of 256 rows, 254 MB)."""
    from torch.utils.checkpoint import checkpoint

    def chunk(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return masked_token_logprobs(head(hidden)[None], None, targets[None], temperature)[0]

    pieces = zip(hidden_N_H.split(rows), targets_N.split(rows), strict=True)
    if not torch.is_grad_enabled():
        return torch.cat([chunk(h, t) for h, t in pieces])
    return torch.cat([checkpoint(chunk, h, t, use_reentrant=False) for h, t in pieces])


def k3_kl(logp_D_T: torch.Tensor, ref_logp_D_T: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(r) - r - 1 with r = ref - policy.

    Unbiased and always >= 0 (Schulman, "Approximating KL divergence").
    """
    log_ratio = ref_logp_D_T - logp_D_T
    return torch.exp(log_ratio) - log_ratio - 1.0


def k1_kl(logp_D_T: torch.Tensor, ref_logp_D_T: torch.Tensor) -> torch.Tensor:
    """Per-token k1 estimator of KL(policy || reference): policy minus reference log-prob of the sampled
    token. Unbiased, but a single token's value can be negative; the original's estimator."""
    return logp_D_T - ref_logp_D_T


def kl_penalized_advantages(
    advantages_D: torch.Tensor, kl_D_T: torch.Tensor, mask_D_T: torch.Tensor, beta: float, mean_kl: float
) -> torch.Tensor:
    """Per-token advantages with the KL to the reference as a reward penalty (the original's recipe).

    On sender tokens A_{d,t} = A_d + beta * (mean_kl - kl_{d,t}), where `kl_D_T` is the per-token
    estimate (`k1_kl` of the sampler's log-probs) and `mean_kl` its mean over every sender token of the
    step, the baseline; 0 elsewhere. Per token, not per episode, and undiscounted: what tinker-cookbook's
    `incorporate_kl_penalty` does with `kl_discount_factor=0`, which the original calls.
    """
    mask = mask_D_T.to(kl_D_T.dtype)
    return (advantages_D.unsqueeze(-1) + beta * (mean_kl - kl_D_T)) * mask


def ppo_clip_loss(
    logp_D_T: torch.Tensor,
    old_logp_D_T: torch.Tensor,
    advantages_D: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss and a 0/1 tensor of where the clip was active.

    loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A). `eps_high > eps_low` is
    DAPO's clip-higher, which keeps low-probability tokens from being stuck. The advantages are one
    per episode, [D], or one per token, [D, T] (`kl_penalized_advantages`).
    """
    ratio_D_T = torch.exp(logp_D_T - old_logp_D_T)
    adv = advantages_D.unsqueeze(-1) if advantages_D.ndim == 1 else advantages_D
    unclipped = ratio_D_T * adv
    clipped = torch.clamp(ratio_D_T, 1.0 - eps_low, 1.0 + eps_high) * adv
    loss_D_T = -torch.minimum(unclipped, clipped)
    return loss_D_T, (clipped < unclipped).float()


def aggregate(
    values_D_T: torch.Tensor, mask_D_T: torch.Tensor, loss_type: LossType, max_tokens: int | None = None
) -> torch.Tensor:
    """Reduce per-token values to one scalar over the masked tokens.

    `dapo`: mean over tokens, every token of the batch weighs the same. `grpo`: mean per episode,
    then over episodes, so long episodes weigh as much as short ones. `dr_grpo`: sum divided by rows x
    `max_tokens`, a fixed normalizer with no length bias. `sum`: the sum over tokens, no normalizer
    (the original's: tinker's `ppo` loss is `-objective.sum()`), so the gradient grows with the number
    of tokens in the step; Adam divides most of that out, a gradient-norm clip does not.
    """
    mask = mask_D_T.to(values_D_T.dtype)
    if mask.sum() == 0:
        raise ValueError("the loss mask selects no token: no episode has a sender token to train on")
    if loss_type == "dapo":
        return (values_D_T * mask).sum() / mask.sum()
    if loss_type == "grpo":
        per_row = (values_D_T * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_row[mask.sum(dim=1) > 0].mean()
    if loss_type == "sum":
        return (values_D_T * mask).sum()
    if max_tokens is None or max_tokens <= 0:
        raise ValueError(f"loss_type 'dr_grpo' needs max_tokens > 0, got {max_tokens}")
    return (values_D_T * mask).sum() / (values_D_T.shape[0] * max_tokens)


def truncated_importance_weights(
    trainer_logp_D_T: torch.Tensor, sampler_logp_D_T: torch.Tensor, cap: float = 2.0
) -> torch.Tensor:
    """min(p_trainer / p_sampler, cap), per token, without gradient: corrects for a sampler that is
    not the trainer (a vLLM server: other numerics, and with `max_off_policy_steps` an older adapter),
    and caps the variance (truncated IS, TRL's `vllm_importance_sampling_cap`)."""
    return torch.exp(trainer_logp_D_T - sampler_logp_D_T).clamp(max=cap).detach()


def policy_loss(
    logp_D_T: torch.Tensor,
    sampler_logp_D_T: torch.Tensor | None,
    advantages: torch.Tensor,
    clip_range: tuple[float, float],
    cap: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss of decoupled PPO, and 0/1 tensors of where the clip and the truncation acted.

    Two old policies, kept apart (Hilton et al. 2021; AReaL): the *proximal* one, the trainer's
    weights as the update starts (`logp_D_T` detached), which PPO's clip measures the step from; and
    the *behaviour* one, whatever sampled the tokens, whose log-probs the sampler returned
    (`sampler_logp_D_T`): the loss is weighed by min(proximal / behaviour, cap) per token
    (`truncated_importance_weights`), so tokens sampled by an older adapter, or by a server with other
    numerics, count as much as the trainer's policy would have sampled them, up to `cap`.
    One update per batch, so the ratio to the proximal policy is 1 with its gradient intact, and the
    clip binds only once there are more. `sampler_logp_D_T` None: the trainer sampled (no weight)."""
    proximal = logp_D_T.detach()
    loss, clipped = ppo_clip_loss(logp_D_T, proximal, advantages, *clip_range)
    if sampler_logp_D_T is None:
        return loss, clipped, torch.zeros_like(clipped)
    weights = truncated_importance_weights(proximal, sampler_logp_D_T, cap)
    truncated = (torch.exp(proximal - sampler_logp_D_T) > cap).float()
    return loss * weights, clipped, truncated


def masked_mean(values_D_T: torch.Tensor, mask_D_T: torch.Tensor) -> torch.Tensor:
    """Mean over the masked tokens, 0 when the mask is empty (for metrics)."""
    mask = mask_D_T.to(values_D_T.dtype)
    return (values_D_T * mask).sum() / mask.sum().clamp(min=1)
