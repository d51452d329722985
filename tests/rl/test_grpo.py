"""GRPO math against numbers worked out by hand."""

import math

import pytest
import torch
from tests.floats import F64

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


def test_without_std_scaling_a_small_spread_stays_small():
    # The original's advantages (reward minus the group mean) against GRPO's on one 4-reward group:
    # mean 0.5; deviations 0, +0.02, -0.02, 0; sample std sqrt(0.0008 / 3) = 0.016330.
    rewards = torch.tensor([[0.50, 0.52, 0.48, 0.50]])
    none = grpo.group_advantages(rewards, "none")
    assert torch.allclose(none, torch.tensor([[0.0, 0.02, -0.02, 0.0]]), atol=1e-6)
    group = grpo.group_advantages(rewards, "group", eps=0.0)
    # GRPO divides by the std: the same near-tie becomes +-1.2247, as large as a clear win would be.
    assert torch.allclose(group, torch.tensor([[0.0, 1.2247, -1.2247, 0.0]]), atol=1e-4)


def test_equal_rewards_give_zero_advantage_and_are_flagged():
    rewards = torch.tensor([[0.7, 0.7, 0.7], [0.1, 0.9, 0.5]])
    adv = grpo.group_advantages(rewards, "group")
    assert torch.equal(adv[0], torch.zeros(3))
    assert grpo.zero_spread_groups(rewards).tolist() == [True, False]


def test_step_advantages_hand_worked():
    # A step's three groups of 3: the middle one has no spread (not kept, zeros in every mode).
    # A: mean 1, deviations -1 0 1, sample std 1; C: mean 3, deviations -1 -1 2, sample std sqrt(6/2).
    rewards = [(0.0, 1.0, 2.0), (0.5, 0.5, 0.5), (2.0, 2.0, 5.0)]
    none = grpo.step_advantages(rewards, "none")
    assert none == [(-1.0, 0.0, 1.0), (0.0, 0.0, 0.0), (-1.0, -1.0, 2.0)]
    group = grpo.step_advantages(rewards, "group")
    s_c = math.sqrt(3)
    assert group[0] == pytest.approx((-1.0, 0.0, 1.0), rel=1e-5)
    assert group[1] == (0.0, 0.0, 0.0)
    assert group[2] == pytest.approx((-1 / s_c, -1 / s_c, 2 / s_c), rel=1e-5)
    # batch: one std over the kept groups' six rewards 0 1 2 2 2 5 (mean 2, squares 4+1+0+0+0+9 = 14,
    # sample std sqrt(14/5)), not over the flat group's too, and not each group's own.
    s_kept = math.sqrt(14 / 5)
    batch = grpo.step_advantages(rewards, "batch")
    assert batch[0] == pytest.approx((-1 / s_kept, 0.0, 1 / s_kept), rel=1e-5)
    assert batch[1] == (0.0, 0.0, 0.0)
    assert batch[2] == pytest.approx((-1 / s_kept, -1 / s_kept, 2 / s_kept), rel=1e-5)
    # what the update trained on before advantages were stored: group_advantages over the kept rows
    kept = torch.tensor([rewards[0], rewards[2]])
    for mode, got in (("none", none), ("group", group), ("batch", batch)):
        assert torch.equal(torch.tensor([got[0], got[2]]), grpo.group_advantages(kept, mode))
    assert grpo.step_advantages([], "group") == []


def close(got, want) -> None:
    torch.testing.assert_close(
        torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64)
    )


def test_each_seats_advantages_are_its_own_hand_worked():
    # Two prompts, each seen by a sender (rewards near 0.2) and a reader (rewards near 4): four groups.
    # sender: (0.1, 0.3) mean 0.2 -> -0.1 +0.1, (0.2, 0.2) flat; reader: (3, 5) mean 4 -> -1 +1, (4, 6)
    # mean 5 -> -1 +1. Under `batch` each seat's std is its own kept groups': sender sample std of
    # 0.1 0.3 = sqrt(0.02), reader's of 3 5 4 6 = sqrt(5/3); one std over all eight would be the
    # reader's nearly alone and leave the sender's advantages at about 0.07.
    rewards = [(0.1, 0.3), (3.0, 5.0), (0.2, 0.2), (4.0, 6.0)]
    seats = ["sender", "reader", "sender", "reader"]
    none = grpo.seat_advantages(rewards, seats, "none")
    close(none, [(-0.1, 0.1), (-1.0, 1.0), (0.0, 0.0), (-1.0, 1.0)])
    batch = grpo.seat_advantages(rewards, seats, "batch")
    s_sender, s_reader = math.sqrt(0.02), math.sqrt(5 / 3)
    assert batch[0] == pytest.approx((-0.1 / s_sender, 0.1 / s_sender), rel=1e-5)
    assert batch[2] == (0.0, 0.0)
    assert batch[1] == pytest.approx((-1 / s_reader, 1 / s_reader), rel=1e-5)
    assert batch[3] == pytest.approx((-1 / s_reader, 1 / s_reader), rel=1e-5)
    # One seat: GRPO's step advantages themselves.
    one = [(0.0, 1.0, 2.0), (0.5, 0.5, 0.5), (2.0, 2.0, 5.0)]
    for mode in ("none", "group", "batch"):
        assert grpo.seat_advantages(one, ["policy"] * 3, mode) == grpo.step_advantages(one, mode)


def test_a_moving_baseline_per_seat_hand_worked():
    # Step 1: no baseline yet, each seat is measured against its step's mean (sender 0.2, reader 4.0),
    # which starts its average. Step 2, decay 0.9: measured against 0.2 and 4.0, then moved by the
    # step's means 0.5 and 3.0: 0.9*0.2 + 0.1*0.5 = 0.23, 0.9*4 + 0.1*3 = 3.9.
    used, after = grpo.ema_baselines({}, {"sender": 0.2, "reader": 4.0}, 0.9)
    assert used == after == pytest.approx({"sender": 0.2, "reader": 4.0})
    used, after = grpo.ema_baselines(after, {"sender": 0.5, "reader": 3.0}, 0.9)
    assert used == pytest.approx({"sender": 0.2, "reader": 4.0})
    assert after == pytest.approx({"sender": 0.23, "reader": 3.9})
    # A seat that did not play this step keeps its average.
    assert grpo.ema_baselines({"sender": 0.2, "reader": 4.0}, {"sender": 0.5}, 0.9)[1] == pytest.approx(
        {"sender": 0.23, "reader": 4.0}
    )
    rewards = [(0.5, 0.5), (2.0, 4.0)]  # a flat sender group still carries signal: 0.3 above average
    seats = ["sender", "reader"]
    close(grpo.ema_advantages(rewards, seats, used, "none"), [(0.3, 0.3), (-2.0, 0.0)])
    # batch: each seat's step std (the reader's sqrt(2)); the sender's step is flat, std 0: unscaled.
    batch = grpo.ema_advantages(rewards, seats, used, "batch", eps=0.0)
    close(batch, [(0.3, 0.3), (-2.0 / math.sqrt(2), 0.0)])
    with pytest.raises(ValueError, match="batch or none"):
        grpo.ema_advantages(rewards, seats, used, "group")


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


def test_k1_kl_is_the_log_ratio_of_the_sampled_token():
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.4)]])
    # ln(0.5 / 0.25) = ln 2; ln(0.2 / 0.4) = -ln 2: one token's k1 can be negative, unlike k3.
    assert torch.allclose(grpo.k1_kl(logp, ref), torch.tensor([[math.log(2), -math.log(2)]]))


def test_kl_in_the_reward_shapes_each_token_around_the_step_mean():
    # Two episodes, advantages +0.5 and -0.5; per-token KL 0.2, -0.1, 0.5 and 0.3 (then padding, whose
    # value must not count). The mean over the 4 sender tokens is 0.9 / 4 = 0.225; beta 0.1.
    advantages = torch.tensor([0.5, -0.5])
    kl = torch.tensor([[0.2, -0.1, 0.5], [0.3, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    shaped = grpo.kl_penalized_advantages(advantages, kl, mask, beta=0.1, mean_kl=0.225)
    # 0.5 + 0.1 * (0.225 - 0.2) = 0.5025; 0.5 + 0.1 * 0.325 = 0.5325; 0.5 - 0.1 * 0.275 = 0.4725;
    # -0.5 + 0.1 * (0.225 - 0.3) = -0.5075; padding 0.
    expected = torch.tensor([[0.5025, 0.5325, 0.4725], [-0.5075, 0.0, 0.0]])
    assert torch.allclose(shaped, expected, atol=1e-6)
    # With the step's mean as the baseline the KL moves no advantage on average: the penalty only
    # ranks tokens against each other.
    assert (shaped - advantages.unsqueeze(-1))[mask].sum().item() == pytest.approx(0.0, abs=1e-6)


def test_ppo_clip_loss_takes_one_advantage_per_token():
    new = torch.log(torch.tensor([[1.5, 0.9]]))
    loss, clipped = grpo.ppo_clip_loss(new, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), 0.2, 0.2)
    # A=+1, ratio 1.5: clipped to 1.2 -> -1.2; A=-1, ratio 0.9 (inside the range): -min(-0.9, -0.9) = 0.9.
    assert torch.allclose(loss, torch.tensor([[-1.2, 0.9]]))
    assert clipped.tolist() == [[1.0, 0.0]]


def test_clip_higher_widens_the_upper_bound_only():
    loss, _ = grpo.ppo_clip_loss(
        torch.log(torch.tensor([[1.5]])), torch.zeros(1, 1), torch.tensor([1.0]), 0.2, 0.28
    )
    assert loss.item() == pytest.approx(-1.28)


def test_loss_types_hand_worked():
    values = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert grpo.aggregate(values, mask, "dapo").item() == pytest.approx(10 / 4)
    assert grpo.aggregate(values, mask, "grpo").item() == pytest.approx((2 + 4) / 2)
    assert grpo.aggregate(values, mask, "dr_grpo", max_tokens=5).item() == pytest.approx(10 / (2 * 5))
    assert grpo.aggregate(values, mask, "sum").item() == pytest.approx(10)


@pytest.mark.parametrize(
    ("loss_type", "long_token", "short_token"),
    [
        ("sum", 1.0, 1.0),  # the original: every token once, no normalizer
        ("dapo", 1 / 4, 1 / 4),  # ours: every token alike, over the 4 tokens of the batch
        ("grpo", 1 / 6, 1 / 2),  # per episode: the 1-token episode's token weighs 3 times more
    ],
)
def test_how_much_each_token_weighs_in_two_episodes_of_3_and_1_tokens(loss_type, long_token, short_token):
    values = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    grpo.aggregate(values, mask, loss_type).backward()
    expected = torch.tensor([[long_token] * 3 + [0.0], [short_token, 0.0, 0.0, 0.0]])
    assert torch.allclose(values.grad, expected)


def test_empty_mask_is_an_error_not_a_nan():
    with pytest.raises(ValueError, match="selects no token"):
        grpo.aggregate(torch.ones(2, 3), torch.zeros(2, 3), "dapo")
    with pytest.raises(ValueError, match="max_tokens"):
        grpo.aggregate(torch.ones(1, 1), torch.ones(1, 1), "dr_grpo")


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


def test_policy_loss_weighs_each_token_by_its_truncated_ratio_hand_worked():
    # Ratios p_trainer / p_sampler: e^0.2 = 1.2214, e^-1 = 0.3679, e^1.5 = 4.4817 (truncated to 2).
    trainer = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    sampler = torch.tensor([[-1.2, -1.0, -2.0]])
    loss, clipped, truncated = grpo.policy_loss(trainer, sampler, torch.tensor([1.0]), (0.2, 0.2), cap=2.0)
    # The ratio to the proximal policy is 1 (one update per batch): the loss is -A x weight.
    assert loss.tolist()[0] == pytest.approx([-math.exp(0.2), -math.exp(-1.0), -2.0], abs=1e-6)
    assert truncated.tolist() == [[0.0, 0.0, 1.0]] and clipped.tolist() == [[0.0, 0.0, 0.0]]
    # d loss / d logp = -A x weight x ratio (ratio 1): the weight is a constant, not differentiated.
    loss.sum().backward()
    assert trainer.grad.tolist()[0] == pytest.approx([-math.exp(0.2), -math.exp(-1.0), -2.0], abs=1e-6)
    # The trainer sampled (no behaviour log-probs): no weight, nothing truncated.
    plain, _, none = grpo.policy_loss(trainer, None, torch.tensor([1.0]), (0.2, 0.2))
    assert plain.tolist() == [[-1.0, -1.0, -1.0]] and none.sum() == 0


@pytest.mark.float_paths
def test_a_one_version_lag_is_corrected_to_the_on_policy_gradient():
    """One-token episodes over 4 outcomes, sampled by the adapter one update behind the trainer's
    weights (behaviour mu = softmax(theta_old)), each outcome in the batch as often as mu draws it.
    The on-policy gradient of the expected advantage under the trainer's pi = softmax(theta) is
    the reference: the corrected loss gives it exactly (no ratio reaches the cap), the loss that
    takes the samples as on-policy gives another one."""
    mu = torch.tensor([1 / 2, 1 / 4, 1 / 8, 1 / 8], dtype=torch.float64)  # two gradients: tests/floats.py
    outcomes = torch.tensor([0, 0, 0, 0, 1, 1, 2, 3])  # 8 rows in mu's proportions
    advantage = torch.tensor([1.0, -0.5, 0.25, -1.0], dtype=torch.float64)
    theta_old = mu.log()

    def loss_at(theta, behaviour):
        logp = torch.log_softmax(theta, -1)[outcomes].unsqueeze(1)
        per_token, _, _ = grpo.policy_loss(logp, behaviour, advantage[outcomes], (0.2, 0.2), cap=2.0)
        return grpo.aggregate(per_token, torch.ones_like(logp, dtype=torch.bool), "dapo")

    # The planted lag: one plain policy-gradient step from the behaviour's weights.
    start = theta_old.clone().requires_grad_()
    loss_at(start, None).backward()
    theta = (theta_old - 2.0 * start.grad).requires_grad_()
    pi = torch.softmax(theta.detach(), -1)
    assert not torch.allclose(pi, mu, atol=1e-2) and (pi / mu).max() < 2.0

    reference = torch.autograd.grad(-(torch.softmax(theta, -1) * advantage).sum(), theta)[0]
    behaviour = mu.log()[outcomes].unsqueeze(1)
    corrected = torch.autograd.grad(loss_at(theta, behaviour), theta)[0]
    uncorrected = torch.autograd.grad(loss_at(theta, None), theta)[0]
    torch.testing.assert_close(corrected, reference, **F64)
    assert (uncorrected - reference).abs().max() > 0.01, (uncorrected, reference)
    # At lag 0 (the behaviour is the trainer) the weights are 1: the two losses agree.
    own = torch.log_softmax(theta.detach(), -1)[outcomes].unsqueeze(1)
    torch.testing.assert_close(torch.autograd.grad(loss_at(theta, own), theta)[0], uncorrected, **F64)
