"""PEFT adapters as every stage uses them: the hash that says which weights played."""

from emoji_rl.lm.adapters import adapter_hash


def test_adapter_hash_follows_the_bytes(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_model.safetensors").write_bytes(b"weights")
    (tmp_path / "a" / "adapter_config.json").write_text("{}")
    first = adapter_hash(tmp_path / "a")
    assert adapter_hash(None) is None
    assert first == adapter_hash(tmp_path / "a")
    (tmp_path / "a" / "adapter_model.safetensors").write_bytes(b"weightz")
    assert adapter_hash(tmp_path / "a") != first


def test_systems_named_with_a_dot_load_and_switch(noisy_adapter):
    """A system named for its judge weight (both-w0.5) is no valid PEFT adapter name as it stands
    (a torch submodule's name holds no "."): each still loads, and switching to it plays its adapter."""
    import torch

    from emoji_rl.lm import models
    from emoji_rl.lm.adapters import active_system, load_systems

    systems = {"base": None, "both-w0.5": str(noisy_adapter), "both-w1.0": str(noisy_adapter)}
    model = load_systems(models.load_causal_lm(models.SMOLLM2, models.pick_runtime("cpu")), systems)
    ids = torch.tensor([[1, 2, 3, 4]])
    logits = {}
    for name, path in systems.items():
        with active_system(model, name, path), torch.no_grad():
            logits[name] = model(input_ids=ids).logits
    assert torch.equal(logits["both-w0.5"], logits["both-w1.0"])  # the same adapter under both names
    assert not torch.allclose(logits["both-w0.5"], logits["base"], atol=1e-3)
