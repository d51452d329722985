"""Shared fixtures: the embedded models load once per test session (offline, CPU)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (`make test` runs one worker per core), each worker's torch gets its share of the
# cores, and so do the processes a test starts: n workers of all-core torch would fight over the cores.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, share)))


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from emoji_rl.lm import models

    return models.load_tokenizer(models.SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_model():
    from emoji_rl.lm import models

    return models.load_causal_lm(models.SMOLLM2, models.pick_runtime("cpu"))


@pytest.fixture(scope="session")
def embedder():
    from emoji_rl.lm import models

    return models.load_embedder()


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    """A tiny random Qwen3.5 (the real class) saved as a model directory the stages load."""
    from tests.launching import save_tiny_qwen3_5

    return save_tiny_qwen3_5(tmp_path_factory.mktemp("qwen3_5") / "model")
