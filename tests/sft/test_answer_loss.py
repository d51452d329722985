"""The SFT stage's own answer-only loss on a CPU against TRL's: the same loss, gradients and logged
metrics on the same collated batch of real chats (TRL's SFTTrainer is the oracle)."""

import math

import pytest
import torch
from tests.floats import FP32_EPS, float64, fp32_inside
from tests.tiny import tiny_llama

from emoji_rl.lm import models
from emoji_rl.sft.data import encode_file, to_dataset
from emoji_rl.sft.loss import answer_loss_trainer, own_loss_blocker
from emoji_rl.sft.trl_config import Config, build_sft_config

CPU = models.Runtime("cpu", torch.float32, "sdpa")


@pytest.fixture
def trainer(chats, tmp_path):
    from peft import LoraConfig

    tokenizer = models.load_tokenizer(models.SMOLLM2)
    examples = encode_file(tokenizer, chats[0], max_length=128, overlong="drop")
    args = build_sft_config(Config(output_dir=str(tmp_path / "run"), eval_data=None), CPU, world_size=1)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    trainer = answer_loss_trainer()(
        model=tiny_llama(vocab_size=len(tokenizer)),
        args=args,
        train_dataset=to_dataset(examples),
        processing_class=tokenizer,
        peft_config=lora,
    )
    float64(trainer.model)  # two losses compared (tests/floats.py), after TRL's fp32 cast
    return trainer


def _loss_grads_metrics(trainer, batch, own: bool, num_items_in_batch=None):
    trainer.own_loss = own
    trainer._metrics["train"].clear()
    trainer._total_train_tokens = 0
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=num_items_in_batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return loss.detach(), grads, {k: list(v) for k, v in trainer._metrics["train"].items()}


@pytest.mark.float_paths
@pytest.mark.parametrize("num_items_in_batch", [None, 100])
def test_the_own_loss_is_trls(trainer, num_items_in_batch):
    trainer.model.train()
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(6)])
    assert (batch["labels"] != -100).sum() > 6  # several answer tokens per chat, behind ~50 shared ones

    theirs = _loss_grads_metrics(trainer, batch, own=False, num_items_in_batch=num_items_in_batch)
    ours = _loss_grads_metrics(trainer, batch, own=True, num_items_in_batch=num_items_in_batch)
    # Ours runs in float64; TRL's is transformers' ForCausalLMLoss, which takes the cross-entropy in
    # fp32 whatever the logits: the oracle itself rounds. A log-softmax over V ids in fp32 is off by
    # at most ~log2(V) ulps of its size (its sum's rounding), and so is its gradient, which then
    # crosses the model's fp32 norms (fp32_inside) in another grouping: ours runs the shared opening
    # once for the 6 chats. Measured (AVX-512): loss 8e-7 (bound 2e-5), gradients 2.7e-7 of the
    # largest (bound 2.6e-6).
    ulps = math.log2(len(trainer.processing_class)) * FP32_EPS
    assert ours[0].dtype == torch.float64
    assert float(ours[0]) == pytest.approx(float(theirs[0]), rel=ulps)
    assert ours[1].keys() == theirs[1].keys()
    for name, grad in theirs[1].items():
        inside = fp32_inside(trainer.model, grad)["atol"]
        torch.testing.assert_close(
            ours[1][name], grad, atol=inside + ulps * float(grad.abs().max()), rtol=0.0
        )
    assert ours[2].keys() == theirs[2].keys() == {"entropy", "mean_token_accuracy", "num_tokens"}
    for key in theirs[2]:
        assert ours[2][key] == pytest.approx(theirs[2][key], rel=ulps), key


def test_the_own_loss_only_where_it_is_tried(trainer):
    gpu = models.Runtime("cuda:0", torch.bfloat16, "sdpa")
    args = trainer.args
    assert own_loss_blocker(args, CPU, 1, padding_free=False) is None
    assert "GPU" in own_loss_blocker(args, gpu, 1, padding_free=False)
    assert "several processes" in own_loss_blocker(args, CPU, 2, padding_free=False)
    assert "padding-free" in own_loss_blocker(args, CPU, 1, padding_free=True)
    checkpointed = build_sft_config(Config(output_dir=args.output_dir, gradient_checkpointing=True), CPU, 1)
    assert "checkpointing" in own_loss_blocker(checkpointed, CPU, 1, padding_free=False)
    dft = build_sft_config(Config(output_dir=args.output_dir, sft_overrides=["loss_type=dft"]), CPU, 1)
    assert "loss_type=dft" in own_loss_blocker(dft, CPU, 1, padding_free=False)
