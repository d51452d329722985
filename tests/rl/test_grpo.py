"""GRPO math against numbers worked out by hand."""

import math

import pytest
import torch

from emoji_rl.rl import grpo


def test_group_advantages_hand_worked():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.4, 0.6, 0.8]])
    # group 1: mean 0.5, sample std sqrt(1/3); group 2: mean 0.5, sample std sqrt(0.2/3)
    none = grpo.group_advantages(rewards, "none")
    assert torch.allclose(none, torch.tensor([[0.5, -0.5, -0.5, 0.5], [-0.3, -0.1, 0.1, 0.3]]))
    group = grpo.group_advantages(rewards, "group", eps=0.0)
    s1, s2 = math.sqrt(1 / 3), math.sqrt(0.2 / 3)
    assert torch.allclose(group[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / s1)
    assert torch.allclose(group[1], torch.tensor([-0.3, -0.1, 0.1, 0.3]) / s2)
    batch = grpo.group_advantages(rewards, "batch", eps=0.0)
    assert torch.allclose(batch, none / rewards.std())


def test_equal_rewards_give_zero_advantage_and_are_flagged():
    rewards = torch.tensor([[0.7, 0.7, 0.7], [0.1, 0.9, 0.5]])
    adv = grpo.group_advantages(rewards, "group")
    assert torch.equal(adv[0], torch.zeros(3))
    assert grpo.zero_spread_groups(rewards).tolist() == [True, False]


def test_group_of_one_is_rejected():
    with pytest.raises(ValueError, match="group >= 2"):
        grpo.group_advantages(torch.tensor([[1.0], [2.0]]))


def test_k3_kl_hand_worked():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.25)]])
    # r = ln(0.5): e^r - r - 1 = 0.5 + ln 2 - 1; equal log-probs give 0.
    kl = grpo.k3_kl(logp, ref)
    assert kl[0, 0].item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl[0, 1].item() == pytest.approx(0.0)


def test_ppo_clip_loss_hand_worked():
    old = torch.zeros(2, 2)
    new = torch.log(torch.tensor([[1.5, 0.9], [1.5, 0.5]]))
    adv = torch.tensor([1.0, -1.0])
    loss, clipped = grpo.ppo_clip_loss(new, old, adv, eps_low=0.2, eps_high=0.2)
    # A=+1: ratio 1.5 clips to 1.2 -> -1.2; ratio 0.9 in range -> -0.9.
    # A=-1: ratio 1.5: min(-1.5, -1.2) = -1.5 -> loss 1.5 (unclipped); ratio 0.5: min(-0.5, -0.8) -> 0.8 (clipped)
    assert torch.allclose(loss, torch.tensor([[-1.2, -0.9], [1.5, 0.8]]))
    assert clipped.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_clip_higher_widens_the_upper_bound_only():
    loss, _ = grpo.ppo_clip_loss(
        torch.log(torch.tensor([[1.5]])), torch.zeros(1, 1), torch.tensor([1.0]), 0.2, 0.28
    )
    assert loss.item() == pytest.approx(-1.28)


def test_aggregations_hand_worked():
    values = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert grpo.aggregate(values, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert grpo.aggregate(values, mask, "seq_mean").item() == pytest.approx((2 + 4) / 2)
    assert grpo.aggregate(values, mask, "constant", max_tokens=5).item() == pytest.approx(10 / (2 * 5))


def test_empty_mask_is_an_error_not_a_nan():
    with pytest.raises(ValueError, match="selects no token"):
        grpo.aggregate(torch.ones(2, 3), torch.zeros(2, 3), "token_mean")
    with pytest.raises(ValueError, match="max_tokens"):
        grpo.aggregate(torch.ones(1, 1), torch.ones(1, 1), "constant")


def test_masked_logprobs_renormalize_over_allowed_tokens():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    allowed = torch.tensor([[[False, True, True]]])
    target = torch.tensor([[1]])
    assert grpo.masked_token_logprobs(logits, allowed, target).item() == pytest.approx(math.log(0.5))
    assert grpo.masked_token_logprobs(logits, None, target).item() == pytest.approx(math.log(0.25))
    # Temperature 2 on logits log(p): p^(1/2) renormalized.
    t2 = grpo.masked_token_logprobs(logits, None, torch.tensor([[0]]), temperature=2.0).item()
    expected = math.sqrt(0.5) / (math.sqrt(0.5) + 2 * math.sqrt(0.25))
    assert t2 == pytest.approx(math.log(expected))


def test_truncated_importance_weights_cap_and_detach():
    trainer = torch.log(torch.tensor([[0.6, 0.2]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.2, 0.4]]))
    w = grpo.truncated_importance_weights(trainer, sampler, cap=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5]]))
    assert not w.requires_grad
