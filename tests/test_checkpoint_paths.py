"""Shipped checkpoints carry no machine paths: their config.json must read the same on any clone."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _absolute_paths(value, where=""):
    """(key path, value) of every string in a JSON tree that is an absolute filesystem path."""
    if isinstance(value, dict):
        return [hit for k, v in value.items() for hit in _absolute_paths(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [hit for n, v in enumerate(value) for hit in _absolute_paths(v, f"{where}[{n}]")]
    return [(where, value)] if isinstance(value, str) and value.startswith("/") else []


CONFIGS = sorted(ROOT.glob("checkpoints/*/config.json"))


# The writer is model.edje.save_checkpoint: it records the tokenizer relative to the checkpoint
# (its own copy inside it), never the venv path it was built from.
@pytest.mark.parametrize("config", CONFIGS, ids=[c.parent.name for c in CONFIGS])
def test_shipped_checkpoint_config_has_no_absolute_paths(config):
    hits = _absolute_paths(json.loads(config.read_text()))
    assert not hits, f"{config.relative_to(ROOT)} records machine paths: {hits}"


def test_saved_checkpoint_config_has_no_absolute_paths(tmp_path, tiny_edje_config):
    from edje.model.edje import EDJEModel, load_checkpoint, save_checkpoint

    save_checkpoint(EDJEModel(tiny_edje_config), str(tmp_path / "ckpt"))
    hits = _absolute_paths(json.loads((tmp_path / "ckpt" / "config.json").read_text()))
    assert not hits, f"config.json records machine paths: {hits}"
    loaded = load_checkpoint(str(tmp_path / "ckpt"))  # and it still loads, its tokenizer from inside it
    assert loaded.config.encoder.tokenizer == str(tmp_path / "ckpt" / "tokenizer")


def test_encode_accepts_the_recorded_weights_under_another_path(tmp_path):
    """A checkpoint records the backbone weights' path on the machine that trained it; the same bytes elsewhere are
    accepted by their recorded sha256, other bytes are refused."""
    from edje.pipeline.encode import resolve_backbone

    config = json.loads((ROOT / "checkpoints/edje-c16-bind/config.json").read_text())
    backbone = config["config"]["backbone"]
    assert backbone["weights_sha256"]
    backbone["pretrained"] = "runs/only-on-the-training-machine/backbone.safetensors"
    adapter = tmp_path / "ckpt"
    adapter.mkdir()
    (adapter / "config.json").write_text(json.dumps(config))

    shipped = str(ROOT / "checkpoints/edje-tiny-convvit-sw.safetensors")
    assert resolve_backbone(None, shipped, None, str(adapter)).pretrained == shipped
    with pytest.raises(ValueError, match="does not match the adapter checkpoint"):
        resolve_backbone(None, str(ROOT / "checkpoints/edje-tiny-clip-sw.safetensors"), None, str(adapter))


def test_a_remote_checkpoints_tokenizer_is_copied_once_by_content(tmp_path, tiny_edje_config, monkeypatch):
    """A checkpoint on another filesystem (fsspec's memory one stands in for S3): its tokenizer is copied to the cache
    once, named by its files' content, and loading it again reuses that copy (no new temporary folder each load)."""
    import fsspec

    from edje.model.edje import EDJEModel, load_checkpoint, save_checkpoint

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    save_checkpoint(EDJEModel(tiny_edje_config), "memory://remote/ckpt")
    try:
        first, again = load_checkpoint("memory://remote/ckpt"), load_checkpoint("memory://remote/ckpt")
        folder = Path(first.config.encoder.tokenizer)
        assert again.config.encoder.tokenizer == str(folder) and folder.parent == tmp_path / "cache" / "edje" / "tokenizers"
        assert [p.name for p in folder.parent.iterdir()] == [folder.name], "one folder, no partial copies left"
        remote = fsspec.filesystem("memory")
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            Path(p).name for p in remote.find("/remote/ckpt/tokenizer"))
        assert first.encoder.tokenizer("a red circle")["input_ids"] == again.encoder.tokenizer("a red circle")["input_ids"]
    finally:
        fsspec.filesystem("memory").rm("/remote", recursive=True)
