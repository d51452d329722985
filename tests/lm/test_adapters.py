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
