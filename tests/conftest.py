"""Shared fixtures: the embedded models load once per test session (offline, CPU)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from emoji_rl import models

    return models.load_tokenizer(models.SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_model():
    from emoji_rl import models

    return models.load_causal_lm(models.SMOLLM2, models.pick_runtime("cpu"))


@pytest.fixture(scope="session")
def embedder():
    from emoji_rl import models

    return models.load_embedder()
