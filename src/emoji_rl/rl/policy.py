"""The trained sender: a base model with a LoRA adapter, and the KL reference on the same weights."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from emoji_rl.errors import UserError
from emoji_rl.lm import models
from emoji_rl.lm.adapters import ADAPTER, REFERENCE, adapter_config
from emoji_rl.lm.lora import DEFAULT_TARGETS, resolve_targets

if TYPE_CHECKING:
    from peft import PeftModel

Reference = Literal["init", "base"]
# A fresh adapter's rank and alpha when the config leaves them open.
FRESH_LORA_R = 16
FRESH_LORA_ALPHA = 32
# Our config keys -> the adapter_config.json keys PEFT writes them as.
_ADAPTER_KEYS = {"lora_r": "r", "lora_alpha": "lora_alpha", "lora_target_modules": "target_modules"}


def check_init_adapter(init_adapter: str, given: dict[str, object]) -> None:
    """The adapter decides its rank, alpha and targets: a value the config gives (not None) must agree
    with its adapter_config.json, or the run would train something else than the config says."""
    saved = adapter_config(init_adapter)
    for key, value in given.items():
        theirs = saved.get(_ADAPTER_KEYS[key])
        if isinstance(value, list) and isinstance(theirs, list):  # PEFT writes a set, in any order
            value, theirs = sorted(value), sorted(theirs)
        if value is not None and value != theirs:
            raise UserError(
                f"{key}={value} disagrees with init_adapter {init_adapter} ({_ADAPTER_KEYS[key]}={theirs} in its "
                f"adapter_config.json): the adapter decides it; drop {key} from the config"
            )


def build_policy(
    model: str,
    runtime: models.Runtime,
    init_adapter: str | None,
    reference: Reference | None,
    lora_r: int | None = None,
    lora_alpha: int | None = None,
    lora_target_modules: list[str] | None = None,
) -> PeftModel:
    """The base model with a trainable LoRA adapter (`init_adapter`, or a fresh one) and, for
    `reference="init"`, the starting adapter again, frozen, as the KL reference: two small adapters on
    one copy of the base weights, never a second copy of the base. `reference=None`: no KL.
    The lora_* arguments shape a fresh adapter (None: FRESH_LORA_R, FRESH_LORA_ALPHA, `lora.DEFAULT_TARGETS`); with
    `init_adapter` the adapter decides, and a given one that disagrees with it is an error."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if init_adapter is not None:
        check_init_adapter(init_adapter, {"lora_r": lora_r, "lora_alpha": lora_alpha})
    base = models.load_causal_lm(model, runtime)
    if init_adapter is None:
        names = DEFAULT_TARGETS if lora_target_modules is None else lora_target_modules
        config = LoraConfig(
            r=FRESH_LORA_R if lora_r is None else lora_r,
            lora_alpha=FRESH_LORA_ALPHA if lora_alpha is None else lora_alpha,
            lora_dropout=0.0,
            target_modules=resolve_targets(base, names, "lora_target_modules"),
        )
        policy = get_peft_model(base, config)
    else:
        if lora_target_modules is not None:  # as the model has them: the adapter saved resolved names
            targets = resolve_targets(base, lora_target_modules, "lora_target_modules")
            check_init_adapter(init_adapter, {"lora_target_modules": targets})
        policy = PeftModel.from_pretrained(base, init_adapter, adapter_name=ADAPTER, is_trainable=True)
        if reference == "init":
            policy.load_adapter(init_adapter, adapter_name=REFERENCE, is_trainable=False)
            policy.set_adapter(ADAPTER)
    # Eval mode throughout: no dropout, so sampling and scoring see one distribution.
    policy.eval()
    return policy


def checkpoint_layers(policy: PeftModel) -> None:
    """Activation checkpointing for the update's forward passes: each decoder layer keeps only its input
    and is recomputed in the backward pass.

    transformers checkpoints a layer only while that layer is in training mode, and the policy stays in
    eval mode (see build_policy); so the decoder layers alone are switched to training mode. Their
    attention, MLP and LoRA modules stay in eval mode, and a forward without gradients (sampling, the
    reference) runs as before."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    policy.get_base_model().activation_checkpointing_enable({"use_reentrant": False})
    layers = [m for m in policy.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise UserError(
            f"gradient_checkpointing: {type(policy.get_base_model()).__name__} has no checkpointable layers"
        )
    for layer in layers:
        layer.training = True


@contextlib.contextmanager
def reference_mode(policy: PeftModel, reference: Reference) -> Iterator[None]:
    """Run the reference: the base with the adapter disabled, or the frozen starting adapter."""
    if reference == "base":
        with policy.disable_adapter():
            yield
        return
    policy.set_adapter(REFERENCE)
    try:
        yield
    finally:
        policy.set_adapter(ADAPTER)  # also makes the policy adapter trainable again
