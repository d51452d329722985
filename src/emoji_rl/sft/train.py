"""`emoji-rl sft`: LoRA SFT of the sender on (message, emoji) chats with TRL's SFTTrainer and PEFT.

Loss on the answer only: each record is rendered with the shared chat template (`template.chat_ids`),
and the tokens after the generation prompt (the emoji, end of turn) carry the loss
(`completion_only_loss`). The defaults are seed 001's: LoRA r=32, lr 5e-4 with linear decay, Adam betas
(0.9, 0.95), effective batch 128, 1 epoch. bf16 and flash-attn 2 are used when the GPU has them
(`models.pick_runtime`, logged); a CPU trains in fp32.

    emoji-rl sft --config configs/cpu/sft.yaml                       # embedded SmolLM2, a few minutes
    emoji-rl sft --config configs/gpu/sft.yaml                       # Qwen3.5-4B, one GPU
    NGPUS=8 launch/train_sft.sh                                      # accelerate launch, DDP (or STRATEGY=fsdp)
    torchrun --nproc_per_node 8 -m emoji_rl.cli sft --config configs/gpu/sft.yaml   # DDP without accelerate
    emoji-rl sft --config configs/gpu/sft.yaml --resume true         # go on from the last checkpoint

The run directory (`output_dir`) holds config.yaml, metrics.jsonl, TensorBoard logs under tensorboard/
(`report_to`: the trackers it also reports to, at metrics.jsonl's steps; trackers.json: their wandb,
trackio and mlflow run),
checkpoint-N/ and, at the end, adapter/: a PEFT LoRA adapter (adapter_config.json +
adapter_model.safetensors) that `PeftModel.from_pretrained` and vLLM's `--lora-modules` load.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from emoji_rl.config import save_config
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import training_log
from emoji_rl.io.metrics import MetricsWriter
from emoji_rl.lm import models
from emoji_rl.lm.distributed import warn_if_fsdp_ignored
from emoji_rl.lm.processes import check_shared_dir, join_processes, peers_named
from emoji_rl.sft.callbacks import metrics_callback, scheduled_lr_callback
from emoji_rl.sft.data import encode_file, encode_records, load_chat_records, reader_chats, to_dataset
from emoji_rl.sft.loss import answer_loss_trainer, own_loss_blocker
from emoji_rl.sft.resume import (
    checkpoint_to_resume,
    evaluated_at_start,
    finish_from,
    is_summary,
    logged_lines,
    planned_steps,
    restore_token_count,
    resume_point,
    trainer_state,
)
from emoji_rl.sft.trl_config import Config, build_sft_config, lora_config

logger = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"
METRICS_FILE = "metrics.jsonl"


def main(cfg: Config) -> None:
    # --- run dir, runtime, TRL config (all checks before any model loads)
    output_dir = Path(cfg.output_dir)
    processes = join_processes(cfg.collective_timeout_s)
    world_size, is_main = processes.num_processes, processes.is_main_process
    check_shared_dir(output_dir, processes, cfg.shared_dir_wait_s)
    checkpoint = checkpoint_to_resume(output_dir, cfg.resume, is_main)
    saved = trainer_state(checkpoint) if checkpoint is not None else None
    # What the run logged before (a fresh run starts metrics.jsonl over).
    logged = training_log(output_dir / METRICS_FILE) if cfg.resume else []
    runtime = models.pick_runtime(dtype=cfg.dtype)
    evaluate_first = checkpoint is None and not evaluated_at_start(logged)
    args = build_sft_config(cfg, runtime, world_size, evaluate_first)
    if runtime.device.startswith("cuda") and runtime.attn_implementation != "flash_attention_2":
        logger.info(
            "flash-attn 2 does not import (see the warning above) or dtype is fp32: attention runs on sdpa"
        )
    logger.info(
        "runtime: %s; %d process(es) x %d per device x %d accumulation = %d sequences per step",
        runtime.describe(),
        world_size,
        args.per_device_train_batch_size,
        args.gradient_accumulation_steps,
        world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps,
    )
    # --- data: validated and tokenized up front, so a bad line fails before the model loads
    tokenizer = models.load_tokenizer(cfg.model)
    train_set = to_dataset(training_examples(cfg, tokenizer))
    eval_set = (
        to_dataset(encode_file(tokenizer, cfg.eval_data, cfg.max_length, cfg.overlong))
        if cfg.eval_data
        else None
    )
    logger.info("data: %d train, %d eval examples", len(train_set), len(eval_set) if eval_set else 0)
    # Written once the inputs are checked: a stage that fails them leaves its directory as it found it
    # (run_lock removes one it made), and the corrected rerun is not taken for a run to resume.
    if is_main:
        save_config(cfg, output_dir)

    resumed_at = saved["global_step"] if saved is not None else 0
    # The steps after the checkpoint are redone, so the lines a dead run logged after it go.
    kept = logged_lines(saved, logged)
    metrics = MetricsWriter(output_dir, resumed_at, cfg, kept) if is_main else contextlib.nullcontext()
    with metrics:
        # --- model: left on the CPU; the Trainer places it on this process's device (DDP, FSDP)
        model = models.load_base_model(cfg.model, runtime)
        trainer = answer_loss_trainer()(
            model=model,
            args=args,
            train_dataset=train_set,
            eval_dataset=eval_set,
            processing_class=tokenizer,
            peft_config=lora_config(cfg, model),
            callbacks=[*([metrics_callback(metrics)] if is_main else []), scheduled_lr_callback()],
        )
        models.warn_if_slow_linear_attention(model, runtime)
        # TRL decides padding-free (padding_free, or packing with a bfd strategy, in sft_overrides).
        models.check_padding_free(trainer.padding_free, model, "sft_overrides")
        blocker = own_loss_blocker(args, runtime, world_size, trainer.padding_free)
        trainer.own_loss = blocker is None
        logger.info(
            "loss: %s", "the shared prompt once, the LM head on answer tokens" if blocker is None else blocker
        )
        state = trainer.accelerator.state
        logger.info(
            "distributed: %s, %d process(es), mixed precision %s",
            state.distributed_type.value,
            state.num_processes,
            state.mixed_precision,
        )
        warn_if_fsdp_ignored(state.distributed_type.value, logger)
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        logger.info(
            "LoRA r=%d on %s: %.2fM trainable parameters",
            cfg.lora_r,
            sorted(trainer.model.peft_config["default"].target_modules),
            trainable / 1e6,
        )

        # --- train, evaluate, save
        if saved is not None:
            restore_token_count(trainer, saved)
            trainer.resumed = resume_point(saved)
        start = time.monotonic()
        adapter_dir = output_dir / ADAPTER_DIR
        with peers_named(output_dir, cfg.collective_timeout_s):
            if checkpoint is not None and trainer.resumed[0] >= planned_steps(trainer):
                summary = logged[kept - 1] if kept and is_summary(logged[kept - 1], resumed_at) else None
                result = finish_from(trainer, checkpoint, summary)
            else:
                result = trainer.train(resume_from_checkpoint=checkpoint)
            seconds = time.monotonic() - start
            eval_loss = final_eval_loss(trainer) if eval_set is not None else float("nan")
            # Every rank calls it: FSDP gathers the shards, rank 0 writes.
            trainer.save_model(str(adapter_dir))
        if is_main:
            logger.info(
                "sft: %d steps in %.0f s, train loss %.4f, eval loss %.4f; adapter at %s",
                result.global_step,
                seconds,
                result.metrics["train_loss"],  # the whole run's (`log`), where training_loss is the call's
                eval_loss,
                adapter_dir,
            )


def training_examples(cfg: Config, tokenizer) -> list:
    """train_data's chats, encoded, and the reader's chats made from a `reader_share` of them."""
    records = load_chat_records(cfg.train_data)
    examples = encode_records(tokenizer, records, cfg.max_length, cfg.overlong, cfg.train_data)
    if cfg.reader_share == 0:
        return examples
    readers = reader_chats(records, cfg.reader_share, cfg.reader_view, cfg.seed)
    if not readers:
        raise UserError(
            f"reader_share={cfg.reader_share} made no reader chat from {cfg.train_data}: it takes records "
            "with a target whose answer is an emoji message"
        )
    source = f"{cfg.train_data} (reader chats, reader_share={cfg.reader_share})"
    reading = encode_records(tokenizer, readers, cfg.max_length, cfg.overlong, source)
    logger.info(
        "reader's seat: %d chats of %d records, reversed (%s view)",
        len(reading),
        len(records),
        cfg.reader_view,
    )
    return examples + reading


def final_eval_loss(trainer) -> float:
    """The eval loss at the run's last step: the Trainer's own evaluation there when `eval_steps` had
    it evaluate at that step (a second would log the same line twice), else a final evaluation."""
    step = trainer.state.global_step
    there = [e["eval_loss"] for e in trainer.state.log_history if e.get("step") == step and "eval_loss" in e]
    return there[-1] if there else trainer.evaluate()["eval_loss"]
