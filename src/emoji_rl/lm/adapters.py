"""PEFT adapters as every stage uses them: the adapter names GRPO trains and keeps its KL reference
under, an adapter directory's config and the hash of its files, and several adapters on one copy of
the base weights, switched per sender (eval-retrieval, eval-wordle, play-web).

It lives in lm/ beside the loading it extends, below the trainer (rl/), the evaluations (eval/) and
the browser game (web/) that all use it, so none of them reaches sideways into another for it. It
names senders by plain name and directory: what a system is (`decode/senders.py`) stays above."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from emoji_rl.errors import UserError

if TYPE_CHECKING:
    import torch
    from peft import PeftModel

ADAPTER = "default"
REFERENCE = "reference"


def adapter_config(adapter: str | Path) -> dict:
    """The adapter_config.json of a PEFT adapter directory."""
    path = Path(adapter) / "adapter_config.json"
    if not path.is_file():
        raise UserError(f"adapter directory {adapter} has no adapter_config.json (is it a PEFT adapter?)")
    return json.loads(path.read_text())


def adapter_hash(adapter: str | Path | None) -> str | None:
    """sha256 over an adapter directory's files (names and bytes, in name order): the stored rows say
    exactly which weights played, even if a run directory is later overwritten. None for the base."""
    if adapter is None:
        return None
    root = Path(adapter)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def require_adapter(name: str, path: str) -> None:
    if not (Path(path) / "adapter_config.json").is_file():
        raise UserError(f"system {name}: {path} has no adapter_config.json (is it a PEFT adapter directory?)")


def peft_name(system: str) -> str:
    """A system's PEFT adapter name: PEFT keeps each adapter as a torch submodule, whose name may not
    hold a "." (as a system named for its judge weight, both-w0.5, does)."""
    return system.replace(".", "_dot_")


def load_systems(base: torch.nn.Module, systems: dict[str, str | None]) -> PeftModel | torch.nn.Module:
    """All adapters on one copy of the base weights, one PEFT adapter per system."""
    from peft import PeftModel

    adapters = {name: path for name, path in systems.items() if path}
    for name, path in adapters.items():
        require_adapter(name, path)
    model: torch.nn.Module = base
    for name, path in adapters.items():
        if isinstance(model, PeftModel):
            model.load_adapter(path, adapter_name=peft_name(name))
        else:
            model = PeftModel.from_pretrained(base, path, adapter_name=peft_name(name))
    model.eval()
    return model


@contextlib.contextmanager
def active_system(model: torch.nn.Module, name: str, adapter: str | None) -> Iterator[None]:
    from peft import PeftModel

    if adapter is None and isinstance(model, PeftModel):
        with model.disable_adapter():
            yield
        return
    if adapter is not None:
        model.set_adapter(peft_name(name))
    yield
