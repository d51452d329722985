"""The modules the sender's LoRA adapts, shared by SFT and a fresh GRPO adapter, checked against the
model per kind of decoder layer and against the way vLLM serves them.

Qwen3.5 has two kinds of decoder layer: Gated DeltaNet (linear attention: `in_proj_qkv`, `in_proj_z`,
`in_proj_b`, `in_proj_a`, `out_proj`) in three layers of every four, full attention (`q/k/v/o_proj`) in
the fourth. PEFT matches target names anywhere in the model and is content when any module matches, so
Llama's names alone adapt the DeltaNet layers' MLP only, and "the name exists" proves nothing: the
check is that every kind of decoder layer gets LoRA on its attention or linear attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from emoji_rl.errors import UserError

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedModel

# Attention (Llama, Qwen), linear attention (Qwen3.5's Gated DeltaNet), MLP: the projections vLLM 0.33
# serves LoRA on for Llama and Qwen3.5. A model takes the ones it has.
DEFAULT_TARGETS = (
    *("q_proj", "k_proj", "v_proj", "o_proj"),
    *("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"),
    *("gate_proj", "up_proj", "down_proj"),
)

# vLLM 0.33 fuses these projections into one layer each (the `packed_modules_mapping` of its Llama and
# Qwen3.5) and loads a LoRA per member. A member the adapter lacks is served at base weights, except in
# in_proj_qkvz, where vLLM takes a missing member's rows to be the rest of the layer: an adapter with
# in_proj_z but not in_proj_qkv fails to load ("Cannot determine how to split lora_b"). One rule for all:
# a pack is adapted whole or not at all.
VLLM_PACKS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"),
    "in_proj_ba": ("in_proj_b", "in_proj_a"),
}


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _linear_names(module: nn.Module) -> list[str]:
    from torch import nn

    names = (_leaf(n) for n, m in module.named_modules() if isinstance(m, nn.Linear))
    return list(dict.fromkeys(names))


def attention_modules(model: PreTrainedModel) -> list[tuple[int, str, nn.Module]]:
    """(layer index, attribute, module) of each decoder layer's attention or linear attention: the child
    named *attn, *attention or mixer (Llama, Qwen3.5: self_attn, linear_attn)."""
    found = []
    for index, layer in enumerate(model.get_decoder().layers):
        for attr, child in layer.named_children():
            if attr.endswith(("attn", "attention")) or attr == "mixer":
                found.append((index, attr, child))
    return found


def layer_kinds(model: PreTrainedModel) -> dict[str, list[tuple[int, str, nn.Module]]]:
    """The attention modules grouped by kind of decoder layer: the config's `layer_types` entry
    (Qwen3.5: linear_attention, full_attention), else the attribute and class of the module."""
    layer_types = getattr(model.config, "layer_types", None)
    kinds: dict[str, list[tuple[int, str, nn.Module]]] = {}
    for index, attr, module in attention_modules(model):
        kind = layer_types[index] if layer_types else f"{attr} ({type(module).__name__})"
        kinds.setdefault(kind, []).append((index, attr, module))
    return kinds


def resolve_targets(model: PreTrainedModel, targets: Sequence[str], key: str) -> list[str]:
    """The names of `targets` that `model` has, as PEFT's target_modules; `key` is the config field the
    errors name. A name neither the model nor DEFAULT_TARGETS has is a typo; a vLLM pack adapted by half,
    or a kind of decoder layer left without LoRA on its attention, is an error that says what to add."""
    model_name = type(model).__name__
    present = {_leaf(name) for name, _ in model.named_modules()}
    unknown = [t for t in targets if t not in present and t not in DEFAULT_TARGETS]
    if unknown:
        raise UserError(
            f"{key}: {unknown} are not modules of {model_name}; its linear modules are: {_linear_names(model)}"
        )
    chosen = [t for t in targets if t in present]
    for pack, members in VLLM_PACKS.items():
        members = [m for m in members if m in present]
        missing = [m for m in members if m not in chosen]
        if missing and len(missing) < len(members):
            raise UserError(
                f"{key} adapts {[m for m in members if m in chosen]} without {missing}: vLLM serves them as "
                f"one layer ({pack}) and needs all of {members} or none; add {', '.join(missing)}"
            )
    for kind, modules in layer_kinds(model).items():
        if not any(set(_linear_names(module)) & set(chosen) for _, _, module in modules):
            index, attr, module = modules[0]
            layers = ", ".join(str(i) for i, _, _ in modules)
            raise UserError(
                f"{key} {list(targets)} leaves the {kind} layers of {model_name} (layers {layers}) without "
                f"LoRA on their attention ({type(module).__name__} at layers.{index}.{attr}): add "
                f"{', '.join(_linear_names(module))}"
            )
    return chosen
