"""The trained sender: a base model with a LoRA adapter, and the KL reference on the same weights."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from emoji_rl import models
from emoji_rl.rl.checkpoint import ADAPTER

if TYPE_CHECKING:
    from peft import PeftModel

REFERENCE = "reference"
Reference = Literal["init", "base"]


def build_policy(
    model: str,
    runtime: models.Runtime,
    init_adapter: str | None,
    reference: Reference | None,
    lora_r: int = 16,
    lora_alpha: int = 32,
    lora_target_modules: str = "all-linear",
) -> PeftModel:
    """The base model with a trainable LoRA adapter (`init_adapter`, or a fresh one) and, for
    `reference="init"`, the starting adapter again, frozen, as the KL reference: two small adapters on
    one copy of the base weights, never a second copy of the base. `reference=None`: no KL."""
    from peft import LoraConfig, PeftModel, get_peft_model

    base = models.load_causal_lm(model, runtime)
    if init_adapter is None:
        lora = LoraConfig(
            r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=lora_target_modules
        )
        policy = get_peft_model(base, lora)
    else:
        policy = PeftModel.from_pretrained(base, init_adapter, adapter_name=ADAPTER, is_trainable=True)
        if reference == "init":
            policy.load_adapter(init_adapter, adapter_name=REFERENCE, is_trainable=False)
            policy.set_adapter(ADAPTER)
    # Eval mode throughout: no dropout, so sampling and scoring see one distribution.
    policy.eval()
    return policy


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
