"""Shared fixtures: the embedded models load once per test session (offline, CPU)."""

from __future__ import annotations

import os

import pytest
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers import models as token_models
from transformers import PreTrainedTokenizerFast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (`make test` runs one worker per core), each worker's torch gets its share of the
# cores, and so do the processes a test starts: n workers of all-core torch would fight over the cores.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, share)))


@pytest.fixture(scope="session", autouse=True)
def offline_trackers(tmp_path_factory):
    """wandb, trackio and mlflow, wherever a test reaches them, log offline into temporary directories:
    wandb into the run directory (no WANDB_DIR), trackio and mlflow into this session's stores. trackio
    reads TRACKIO_DIR once, when first imported, which no test module does at collection. mlflow's is a
    folder (its file store, which it must be allowed to use): mlflow-skinny has no database store."""
    os.environ["WANDB_MODE"] = "offline"
    os.environ.pop("WANDB_DIR", None)
    os.environ["TRACKIO_DIR"] = str(tmp_path_factory.mktemp("trackio"))
    os.environ["MLFLOW_TRACKING_URI"] = tmp_path_factory.mktemp("mlflow").as_uri()
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from emoji_rl.lm import models

    return models.load_tokenizer(models.SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_model():
    from emoji_rl.lm import models

    return models.load_causal_lm(models.SMOLLM2, models.pick_runtime("cpu"))


@pytest.fixture(scope="session")
def smollm2_model_f64():
    """SmolLM2 in float64, for tests that compare two orders of one computation (tests/floats.py)."""
    from tests.floats import float64

    from emoji_rl.lm import models

    return float64(models.load_causal_lm(models.SMOLLM2, models.pick_runtime("cpu")))


@pytest.fixture(scope="session")
def embedder():
    from emoji_rl.lm import models

    return models.load_embedder()


@pytest.fixture(scope="session")
def embedder_f64():
    """MiniLM in float64, for tests that compare two orders of one similarity (tests/floats.py)."""
    from emoji_rl.lm import models

    return models.load_embedder().double()


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    """A tiny random Qwen3.5 (the real class) saved as a model directory the stages load."""
    from tests.launching import save_tiny_qwen3_5

    return save_tiny_qwen3_5(tmp_path_factory.mktemp("qwen3_5") / "model")


@pytest.fixture(scope="session")
def padded_qwen3_5():
    """A tiny Qwen3.5 with the real vocabulary, its lm_head as wide as Qwen3.5's (248,320 rows for
    248,077 tokens), and the padding rows set to win: their logits dwarf every token's."""
    import torch
    from tests.tiny import QWEN3_5_LOGITS, qwen3_5_vocabulary, tiny_qwen3_5

    tokenizer = qwen3_5_vocabulary()
    ids = {name: getattr(tokenizer, name) for name in ("eos_token_id", "pad_token_id")}
    model = tiny_qwen3_5(vocab_size=QWEN3_5_LOGITS, tie_word_embeddings=False, **ids).eval()
    assert len(tokenizer) == 248077 < QWEN3_5_LOGITS
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[len(tokenizer) :] = 1000 * torch.randn(QWEN3_5_LOGITS - len(tokenizer), head.shape[1])
    return model, tokenizer


# Tiny HF tokenizers built in memory, for compiling the grammar without loading a model.
TEMPLATE = "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"


@pytest.fixture(scope="session")
def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with no merges: one token per byte (ids 0-255), `<|im_end|>` (256)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(token_models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=TEMPLATE)
    tokenizer.add_special_tokens({"eos_token": "<|im_end|>"})
    return tokenizer


def _word_level_tokenizer(eos: bool) -> PreTrainedTokenizerFast:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2} | ({"<|im_end|>": 3} if eos else {})
    backend = Tokenizer(token_models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        eos_token="<|im_end|>" if eos else None,
        chat_template=TEMPLATE,
    )


@pytest.fixture(scope="session")
def word_level_tokenizer() -> PreTrainedTokenizerFast:
    """Whole words only: no byte of any emoji is a token."""
    return _word_level_tokenizer(eos=True)


@pytest.fixture(scope="session")
def tokenizer_without_eos() -> PreTrainedTokenizerFast:
    return _word_level_tokenizer(eos=False)


@pytest.fixture(scope="session")
def noisy_adapter(tmp_path_factory):
    """A LoRA adapter on SmolLM2 initialized at random (not as a no-op), saved where an evaluation's
    NAME=ADAPTER_DIR reads it: a system that plays unlike the base."""
    import torch
    from peft import LoraConfig, get_peft_model

    from emoji_rl.lm import models

    torch.manual_seed(0)
    base = models.load_causal_lm(models.SMOLLM2, models.pick_runtime("cpu"))
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    path = tmp_path_factory.mktemp("noisy") / "adapter"
    get_peft_model(base, lora).save_pretrained(path)
    return path
