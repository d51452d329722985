"""The machine itself: what torch, the driver and the kernels are (environment), and whether NCCL's
collectives run (nccl)."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from emoji_rl.lm import models
from emoji_rl.selftest.core import Config, Result, Skipped, check, is_cuda, last_line


def _import_status(module: str) -> str:
    err = models.import_error(module)
    return "yes" if err is None else f"no ({last_line(err)})"


# transformers binds each of these names, when its Qwen3.5 module is imported, to the package's kernel
# if that imports, else to its own torch code; the binding is kept in the wrapper's closure.
_QWEN_KERNEL_FUNCTIONS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)


def linear_attention_paths() -> dict[str, str]:
    """Each of transformers' Qwen3.5 linear-attention functions -> what it actually runs."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    paths = {}
    for name in _QWEN_KERNEL_FUNCTIONS:
        bound = inspect.getclosurevars(getattr(qwen, name)).nonlocals.get("implementation")
        paths[name] = (
            f"{bound.__module__}.{bound.__qualname__}"
            if bound is not None
            else "unknown: transformers no longer binds it in a closure"
        )
    return paths


@check("environment")
def environment(cfg: Config, runtime: models.Runtime) -> Result:
    import transformers

    details = {"torch": torch.__version__, "transformers": transformers.__version__}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        details["cuda"] = f"{torch.version.cuda}, {torch.cuda.device_count()} device(s)"
        details["device 0"] = (
            f"{props.name}, {props.total_memory / 1e9:.1f} GB, sm_{props.major}{props.minor}"
        )
        details["NVIDIA driver"] = nvidia_driver()
    else:
        details["cuda"] = "not available" + (
            f" (torch built for {torch.version.cuda})" if torch.version.cuda else ""
        )
    for module in ("flash_attn", *models.LINEAR_ATTENTION_KERNELS):
        details[f"import {module}"] = _import_status(module)
    details["attention"] = runtime.attn_implementation
    paths = linear_attention_paths()
    details |= {f"Qwen3.5 {name}": path for name, path in paths.items()}
    prefill = paths["torch_chunk_gated_delta_rule"]
    deltanet = {"fla": "fla's kernels", "transformers": "transformers' torch reference"}.get(
        prefill.split(".")[0], prefill
    )
    figure = (
        f"torch {torch.__version__}, {details.get('device 0', 'no CUDA')}"
        f"{', driver ' + details['NVIDIA driver'] if 'NVIDIA driver' in details else ''}; "
        f"attention {runtime.attn_implementation}; Gated DeltaNet on {deltanet}"
    )
    return Result("PASS", figure, details)


def nvidia_driver() -> str:
    """The driver's version as nvidia-smi reports it, or "unknown": only reported, never a FAIL."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown (no nvidia-smi on PATH)"
    try:
        done = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return f"unknown ({last_line(err)})"
    versions = sorted(set(done.stdout.split()))
    return (
        ", ".join(versions)
        if done.returncode == 0 and versions
        else f"unknown (nvidia-smi exit {done.returncode})"
    )


@check("nccl")
def nccl(cfg: Config, runtime: models.Runtime) -> Result:
    """A one-process group (NCCL on CUDA, gloo on a CPU) through a file store: an all_reduce and a
    broadcast checked for their values, then the group destroyed. Across processes and GPUs is the
    multi-GPU launch's own test (tests/test_fsdp.py on gloo)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise Skipped(
            "a process group already exists in this process (under torchrun?): run the selftest alone"
        )
    cuda = is_cuda(runtime)
    backend = "nccl" if cuda else "gloo"
    device = torch.device(runtime.device)
    if cuda and device.index is None:  # NCCL binds the group to one device, by its index
        device = torch.device("cuda", torch.cuda.current_device())
    with tempfile.TemporaryDirectory() as store:
        dist.init_process_group(
            backend,
            init_method=(Path(store) / "store").as_uri(),
            rank=0,
            world_size=1,
            device_id=device if cuda else None,
        )
        try:
            # In bf16 as gradients are reduced, and in fp32; a one-process sum is the tensor itself.
            sums = [
                torch.arange(1, 9, device=device, dtype=dtype) for dtype in (torch.bfloat16, torch.float32)
            ]
            for tensor in sums:
                dist.all_reduce(tensor)
            sent = torch.tensor([3, 1, 4, 1, 5], device=device)
            dist.broadcast(sent, src=0)
            dist.barrier()
            got = [t.tolist() for t in (*sums, sent)]
        finally:
            dist.destroy_process_group()
    want = [list(range(1, 9))] * 2 + [[3, 1, 4, 1, 5]]
    ok = got == want
    figure = (
        f"{backend}{'' if cuda else ' (no CUDA)'}, 1 process: all_reduce bf16 and fp32, broadcast int64: "
    )
    return Result("PASS" if ok else "FAIL", figure + ("values as sent" if ok else f"got {got}, want {want}"))
