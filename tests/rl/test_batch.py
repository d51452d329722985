"""Log-probs under the grammar from its support alone: the same values and gradients as the masked
softmax over the whole vocabulary, with masks a few hundred ids wide."""

from __future__ import annotations

import random

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tests.floats import F64, float64, fp32_inside
from tests.tiny import tiny_llama, tiny_qwen3_5

from emoji_rl.decode.shared_prefix import kept_logits
from emoji_rl.emoji.alphabet import ALPHABET
from emoji_rl.emoji.constraint import compile_emoji_grammar, replay_masks
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.lm import template
from emoji_rl.play.types import Episode, StepResult, Turn
from emoji_rl.rl import grpo
from emoji_rl.rl.batch import collate, support_columns, token_logprobs

TEMPERATURE = 0.7


def two_turn_episodes(tokenizer, count: int) -> list[Episode]:
    """`count` episodes of two sender turns (2-4 emoji each, end of turn) with game feedback between."""
    rng = random.Random(0)
    stop = template.stop_token_id(tokenizer)
    prompt = tuple(template.chat_ids(tokenizer, sender_messages("Pizza and a movie tonight")))
    feedback = tuple(tokenizer.encode("\nThe judge guessed: a party. Try again.\n"))
    episodes = []
    for i in range(count):
        turns = []
        for observation in (prompt, feedback):
            message = " ".join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 4)))
            action = (*tokenizer.encode(message), stop)
            result = StepResult(done=observation == feedback, reward=float(i))
            turns.append(Turn(observation, action, (0.0,) * len(action), result))
        episodes.append(Episode(tuple(turns)))
    return episodes


def full_vocabulary_logprobs(model, batch, episodes, constraint) -> torch.Tensor:
    """The log-probs as the trainer computed them before the support: the [N, V] logits, masked by
    the full-width replayed masks, log-softmax over the whole vocabulary."""
    logits = kept_logits(
        model, batch.input_ids_D_T[:, :-1], batch.attention_D_T[:, :-1], batch.mask_D_T, False
    )
    masks = torch.cat([replay_masks(constraint, turn.action_ids) for e in episodes for turn in e.turns])
    targets = batch.input_ids_D_T[:, 1:][batch.mask_D_T]
    return grpo.masked_token_logprobs(logits[None], masks[None], targets[None], TEMPERATURE)[0]


def lora(model, target_modules: list[str]):
    torch.manual_seed(1)
    policy = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=target_modules))
    for name, param in policy.named_parameters():
        if "lora_B" in name:  # nonzero, so the adapter changes the logits
            torch.nn.init.normal_(param, std=0.02)
    return policy


def logprobs_and_grads(compute, policy) -> tuple[torch.Tensor, list[torch.Tensor]]:
    policy.zero_grad()
    logp = compute()
    (logp * torch.linspace(-1, 1, len(logp))).sum().backward()
    return logp.detach(), [p.grad.clone() for p in policy.parameters() if p.requires_grad]


def float64_model(model_name, tokenizer, smollm2_model_f64):
    """Both paths in float64 (tests/floats.py): SmolLM2 itself, or a tiny Qwen3.5 as wide as its vocabulary."""
    if model_name == "smollm2":
        return smollm2_model_f64
    return float64(tiny_qwen3_5(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id))


@pytest.mark.float_paths
@pytest.mark.parametrize(
    ("model_name", "targets", "share_prefix"),
    [
        ("smollm2", ["q_proj", "v_proj"], False),  # tied embeddings, the head narrowed
        ("smollm2", ["q_proj", "v_proj"], True),
        ("qwen3_5", ["q_proj", "v_proj", "in_proj_qkv"], False),  # Qwen3.5's own class, untied head
        ("qwen3_5", ["q_proj", "lm_head"], False),  # an adapted head: the full logits, then the support's
    ],
)
def test_logprobs_over_the_support_are_the_full_vocabularys(
    model_name, targets, share_prefix, smollm2_tokenizer, smollm2_model_f64
) -> None:
    model = float64_model(model_name, smollm2_tokenizer, smollm2_model_f64)
    constraint = compile_emoji_grammar(
        smollm2_tokenizer, vocab_size=model.get_output_embeddings().weight.shape[0]
    )
    episodes = two_turn_episodes(smollm2_tokenizer, 4)
    batch = collate(episodes, torch.zeros(4), smollm2_tokenizer.pad_token_id, constraint)
    policy = lora(model, targets)
    head = policy.get_output_embeddings()
    try:
        ours, our_grads = logprobs_and_grads(
            lambda: token_logprobs(policy, batch, TEMPERATURE, share_prefix)[batch.mask_D_T], policy
        )
        full, full_grads = logprobs_and_grads(
            lambda: full_vocabulary_logprobs(policy, batch, episodes, constraint), policy
        )
        assert policy.get_output_embeddings() is head  # the narrowed head was put back
    finally:
        policy.unload()  # smollm2_model_f64 is shared by the session: leave it unadapted
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, full, **F64)
    assert len(our_grads) == len(full_grads) > 0
    for ours_grad, full_grad in zip(our_grads, full_grads, strict=True):
        torch.testing.assert_close(ours_grad, full_grad, **F64)


@pytest.mark.float_paths
def test_rows_under_the_grammar_and_of_free_text_in_one_batch_score_as_apart(smollm2_tokenizer) -> None:
    """A game's two seats train together (docs/DESIGN.md §14): rows sampled under the grammar and rows
    of free text in one batch, one forward pass, each row's log-probs and the LoRA gradients what a
    batch of its kind alone gives (the grammar's support for one, the tokenizer's ids for the other)."""
    tokenizer = smollm2_tokenizer
    model = float64(tiny_llama(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id))
    constraint = compile_emoji_grammar(tokenizer, vocab_size=len(tokenizer))
    emoji = two_turn_episodes(tokenizer, 2)
    stop = template.stop_token_id(tokenizer)
    done = StepResult(done=True, reward=0.0)
    prompt = tuple(tokenizer.encode("What was the message?"))
    text = [(*tokenizer.encode(guess), stop) for guess in ("Pizza tonight", "We watch a film at home")]
    free = [Episode((Turn(prompt, ids, (0.0,) * len(ids), done),)) for ids in text]
    pad, width = tokenizer.pad_token_id, len(tokenizer)
    kinds = [True, False, True, False]
    mixed = collate([emoji[0], free[0], emoji[1], free[1]], torch.zeros(4), pad, constraint, 0, width, kinds)
    assert mixed.constrained_D.tolist() == kinds and mixed.allowed_N_S[1].shape[0] == 0
    alone = (
        collate(emoji, torch.zeros(2), pad, constraint, 0, width),
        collate(free, torch.zeros(2), pad, None, 0, width),
    )
    policy = lora(model, ["q_proj", "v_proj"])

    def rows(batch, picked):
        logp = token_logprobs(policy, batch, TEMPERATURE)
        return [logp[d][batch.mask_D_T[d]] for d in picked]

    def together() -> torch.Tensor:
        return torch.cat(rows(mixed, [0, 2]) + rows(mixed, [1, 3]))

    def apart() -> torch.Tensor:
        return torch.cat(rows(alone[0], [0, 1]) + rows(alone[1], [0, 1]))

    ours, our_grads = logprobs_and_grads(together, policy)
    theirs, their_grads = logprobs_and_grads(apart, policy)
    assert ours.dtype == torch.float64 and len(ours) > 20
    torch.testing.assert_close(ours, theirs, **F64)
    for ours_grad, their_grad in zip(our_grads, their_grads, strict=True):
        torch.testing.assert_close(ours_grad, their_grad, **F64)
    # A micro-batch of one kind alone, cut from the mixed batch to its own longest row, scores its rows
    # the same.
    short = mixed.rows(1, 2)
    assert short.input_ids_D_T.shape[1] == len(free[0].token_ids()) < mixed.input_ids_D_T.shape[1]
    assert short.mask_D_T.shape == short.sampler_logp_D_T.shape == (1, len(free[0].token_ids()) - 1)
    with torch.no_grad():
        for cut, kind, d in ((mixed.rows(1, 2), alone[1], 0), (mixed.rows(2, 3), alone[0], 1)):
            got = token_logprobs(policy, cut, TEMPERATURE)[0][cut.mask_D_T[0]]
            torch.testing.assert_close(
                got, token_logprobs(policy, kind, TEMPERATURE)[d][kind.mask_D_T[d]], **F64
            )


def test_collate_keeps_masks_over_the_support_only(smollm2_tokenizer) -> None:
    constraint = compile_emoji_grammar(smollm2_tokenizer)
    episodes = two_turn_episodes(smollm2_tokenizer, 3)
    batch = collate(episodes, torch.zeros(3), smollm2_tokenizer.pad_token_id, constraint)
    assert torch.equal(batch.support, constraint.support)
    for episode, allowed in zip(episodes, batch.allowed_N_S, strict=True):
        full = torch.cat([replay_masks(constraint, turn.action_ids) for turn in episode.turns])
        assert torch.equal(allowed, full[:, constraint.support])
        assert allowed.shape[1] * 100 < full.shape[1]  # a few hundred ids, not the vocabulary
    narrow = batch.rows(1, 3)
    assert narrow.allowed_N_S == batch.allowed_N_S[1:3] and narrow.support is batch.support


def test_an_id_outside_the_support_is_named() -> None:
    support = torch.tensor([3, 7, 9])
    assert support_columns(support, torch.tensor([9, 3, 7, 7])).tolist() == [2, 0, 1, 1]
    with pytest.raises(ValueError, match=r"token ids \[4, 10\] are outside the grammar's support"):
        support_columns(support, torch.tensor([3, 4, 10]))


@pytest.mark.float_paths
@pytest.mark.parametrize(
    ("model_name", "targets", "share_prefix"),
    [
        ("smollm2", ["q_proj", "v_proj"], True),  # tied embeddings
        ("qwen3_5", ["q_proj", "in_proj_qkv"], False),  # untied head
        ("qwen3_5", ["q_proj", "lm_head"], False),  # an adapted head
    ],
)
def test_logprobs_without_a_grammar_chunk_by_chunk_are_the_whole_vocabularys(
    model_name, targets, share_prefix, smollm2_tokenizer, smollm2_model_f64, monkeypatch
) -> None:
    """Wordle's log-probs (no grammar), a few positions at a time with each chunk's logits recomputed
    in the backward pass: the values and LoRA gradients of one log-softmax over [N, V], and no
    tensor of N x V kept for the backward."""
    from functools import partial

    model = float64_model(model_name, smollm2_tokenizer, smollm2_model_f64)
    monkeypatch.setattr(grpo, "head_token_logprobs", partial(grpo.head_token_logprobs, rows=5))
    episodes = two_turn_episodes(smollm2_tokenizer, 4)
    batch = collate(episodes, torch.zeros(4), smollm2_tokenizer.pad_token_id, None)
    n, vocab = int(batch.mask_D_T.sum()), model.get_output_embeddings().weight.shape[0]
    policy = lora(model, targets)
    saved: list[int] = []

    def chunked() -> torch.Tensor:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            return token_logprobs(policy, batch, TEMPERATURE, share_prefix)[batch.mask_D_T]

    def whole() -> torch.Tensor:
        inputs = (batch.input_ids_D_T[:, :-1], batch.attention_D_T[:, :-1], batch.mask_D_T, share_prefix)
        logits = kept_logits(policy, *inputs)
        targets_N = batch.input_ids_D_T[:, 1:][batch.mask_D_T]
        return grpo.masked_token_logprobs(logits[None], None, targets_N[None], TEMPERATURE)[0]

    try:
        ours, our_grads = logprobs_and_grads(chunked, policy)
        full, full_grads = logprobs_and_grads(whole, policy)
    finally:
        policy.unload()
    assert n > 10 and max(saved) < n * vocab  # several chunks, none of them all N rows
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, full, **F64)
    assert len(our_grads) == len(full_grads) > 0
    for ours_grad, full_grad in zip(our_grads, full_grads, strict=True):
        torch.testing.assert_close(ours_grad, full_grad, **F64)


@pytest.mark.float_paths
def test_the_trainer_scores_an_unconstrained_sample_as_the_sampler_drew_it(padded_qwen3_5) -> None:
    """Without a grammar the sampler masks the LM head's padding ids (here set to win): the trainer
    scores over the same ids, so its log-probs are the sampler's."""
    import copy

    from emoji_rl.decode.generate import Decoding, generate_from_ids

    model, tokenizer = padded_qwen3_5
    model = float64(copy.deepcopy(model))  # the decoder against the trainer's pass: tests/floats.py
    prompt = tuple(tokenizer.encode("Guess the word"))
    decoding = Decoding("none", temperature=TEMPERATURE, max_new_tokens=5)
    replies = generate_from_ids(model, tokenizer, [prompt] * 3, decoding, seed=0)
    done = StepResult(done=True, reward=0.0)
    episodes = [Episode((Turn(prompt, reply.token_ids, reply.logprobs, done),)) for reply in replies]
    batch = collate(episodes, torch.zeros(3), tokenizer.pad_token_id, None, tokens=len(tokenizer))
    with torch.no_grad():
        ours = token_logprobs(model, batch, TEMPERATURE)[batch.mask_D_T]
    sampled = torch.tensor([p for reply in replies for p in reply.logprobs], dtype=torch.float64)
    # Qwen3.5's Gated DeltaNet steps one token at a time in fp32 inside, the trainer's pass chunks them.
    torch.testing.assert_close(ours, sampled, **fp32_inside(model, sampled))
