"""`sizing`: do configs/gpu/sft.yaml and grpo.yaml fit this card's memory, and if not, what to lower?

One decoder layer's activations are measured here, on this device with its kernels: the tensors that
autograd keeps for the backward of a forward through Qwen3.5-4B's layers under LoRA, per layer and
token. The rest is counted on the real 4B config (32 layers), as `make bench-scale`'s sizing table
(docs/gpu/README.md, "Sizing") counts it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import yaml

from emoji_rl.bench.scale import counted_parameters
from emoji_rl.bench.shapes import MICRO_BATCH, QWEN3_5_4B, QWEN3_5_4B_LAYERS, step_episodes
from emoji_rl.lm import models
from emoji_rl.selftest.core import Config, Result, Skipped, check, dtype_name, is_cuda
from emoji_rl.selftest.stages import CPU_WIDTHS, lora_model

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "gpu"
LORA_R = 32  # configs/gpu: the stages' default rank
# One period of Qwen3.5's layer pattern (3 linear attention, 1 full attention), so the mean is 32 layers'.
MEASURED_LAYERS = 4
# (rows, tokens a row) of the measured forward; activations grow with the tokens, the figure is per token.
MEASURED = {"cuda": (2, 512), "cpu": (2, 64)}
# The CUDA context, the allocator's slack and the log-probs of a micro-batch (docs/gpu/README.md, "Sizing": a few GB).
OVERHEAD_GB = 3.0


def activation_bytes_per_layer_token(runtime: models.Runtime) -> float:
    """Bytes the backward keeps per decoder layer and token: every tensor autograd saves in a forward
    through LoRA layers (its storage counted once), the weights left out, over MEASURED_LAYERS."""
    model = lora_model(runtime, MEASURED_LAYERS, LORA_R)
    rows, length = MEASURED["cuda" if is_cuda(runtime) else "cpu"]
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    embeds = torch.randn(rows, length, model.config.hidden_size, device=runtime.device, dtype=runtime.dtype)
    bf16 = runtime.dtype == torch.bfloat16
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        torch.autocast(runtime.device.split(":")[0], dtype=torch.bfloat16, enabled=bf16),
    ):
        # The graph, and so what it saved, lives as long as the output: counted while it does.
        out = model.get_base_model().model(inputs_embeds=embeds.requires_grad_())
        measured = sum(kept.values()) / (MEASURED_LAYERS * rows * length)
    del out
    return measured


@dataclasses.dataclass(frozen=True)
class Plan:
    """A trainer config's memory knobs: sequences (or episodes) a micro-batch, their tokens each."""

    name: str
    rows: int
    tokens_per_row: float
    checkpointing: bool

    def need_gb(self, fixed_gb: float, per_layer_token: float, rows: int, checkpointing: bool) -> float:
        tokens = rows * self.tokens_per_row
        layer = per_layer_token * tokens
        if checkpointing:  # each layer keeps its bf16 input, and one layer at a time is recomputed
            activations = QWEN3_5_4B_LAYERS * tokens * QWEN3_5_4B["hidden_size"] * 2 + layer
        else:
            activations = QWEN3_5_4B_LAYERS * layer
        return fixed_gb + activations / 1e9

    def advice(self, fixed_gb: float, per_layer_token: float, card_gb: float) -> tuple[bool, str]:
        """(fits at all, what to set): as configured, with checkpointing, or with fewer rows too."""
        need = self.need_gb(fixed_gb, per_layer_token, self.rows, self.checkpointing)
        if need <= card_gb:
            return True, f"{self.name} fits as configured ({need:.0f} GB)"
        rows = self.rows
        while rows >= 1:
            need = self.need_gb(fixed_gb, per_layer_token, rows, True)
            if need <= card_gb:
                lower = f", per_device_train_batch_size: {rows}" if rows < self.rows else ""
                return True, f"{self.name}: set gradient_checkpointing: true{lower} ({need:.0f} GB)"
            rows //= 2
        return False, f"{self.name} does not fit even one row with checkpointing ({need:.0f} GB)"


def gpu_plans() -> list[Plan]:
    """configs/gpu/grpo.yaml (episodes as bench-scale writes them) and sft.yaml (sequences of
    max_length tokens, an upper bound), their unset fields at the stages' defaults."""
    from emoji_rl.play.registry import DEFAULT_GAME
    from emoji_rl.rl.train_config import config_class
    from emoji_rl.sft.trl_config import Config as SftConfig

    plans = []
    for stage, defaults in (("grpo", config_class(DEFAULT_GAME)), ("sft", SftConfig)):
        path = CONFIGS / f"{stage}.yaml"
        if not path.is_file():
            raise Skipped(f"no {path}: not run from a clone? (docs/gpu/SELFTEST.md)")
        values = {f.name: f.default for f in dataclasses.fields(defaults)} | (
            yaml.safe_load(path.read_text()) or {}
        )
        if stage == "grpo":
            episodes = step_episodes(MICRO_BATCH)
            per_row = sum(
                len(t.observation_ids) + len(t.action_ids) for e in episodes for t in e.turns
            ) / len(episodes)
        else:
            per_row = values["max_length"]
        plans.append(
            Plan(
                f"configs/gpu/{stage}.yaml",
                values["per_device_train_batch_size"],
                per_row,
                values["gradient_checkpointing"],
            )
        )
    return plans


@check("sizing")
def sizing(cfg: Config, runtime: models.Runtime) -> Result:
    """A layer's activations measured here; with them, whether each gpu config fits this card."""
    plans = gpu_plans()
    per_layer_token = activation_bytes_per_layer_token(runtime)
    width = QWEN3_5_4B["hidden_size"] if is_cuda(runtime) else CPU_WIDTHS["hidden_size"]
    measured = (
        f"a layer keeps {per_layer_token / 1e3:.1f} KB a token "
        f"(measured: hidden {width}, {dtype_name(runtime.dtype)}, {runtime.attn_implementation})"
    )
    if not is_cuda(runtime):
        raise Skipped(f"no CUDA; {measured}")
    props = torch.cuda.get_device_properties(torch.device(runtime.device))
    card_gb = props.total_memory / 1e9
    weights, lora = counted_parameters(LORA_R)
    # bf16 weights; the LoRA's fp32 weight, gradient and two AdamW moments
    fixed_gb = (2 * weights + 16 * lora) / 1e9 + OVERHEAD_GB
    verdicts = [plan.advice(fixed_gb, per_layer_token, card_gb) for plan in plans]
    figure = f"{props.name}, {card_gb:.0f} GB; {measured}; " + "; ".join(text for _, text in verdicts)
    return Result("PASS" if all(fits for fits, _ in verdicts) else "FAIL", figure)
