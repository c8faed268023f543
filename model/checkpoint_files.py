"""An EDJE checkpoint's files (config.json, model.safetensors, tokenizer/) and what reads them without torch.

The serving ingress reads a checkpoint's ranking rule and measures texts with its tokenizer; neither needs the
model, so neither imports torch or transformers (the ingress replica starts in a fifth of the memory).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import fsspec

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER = "tokenizer"
# The fast tokenizer's one file, as `save_pretrained` writes it.
TOKENIZER_FILE = "tokenizer.json"


class CheckpointError(ValueError):
    """A checkpoint is missing, or does not match the config it is loaded with."""


def read_checkpoint_config(path: str) -> dict:
    """The JSON side of a checkpoint: {'config': EDJEConfig dict, 'adapter_hash': ..., ...}."""
    fs, root = fsspec.core.url_to_fs(path)
    if not fs.exists(f"{root}/{CONFIG}"):
        raise CheckpointError(f"{path} is not an EDJE checkpoint: {CONFIG} is missing")
    with fs.open(f"{root}/{CONFIG}") as f:
        return json.load(f)


def local_tokenizer(fs, root: str) -> str:
    """A local folder holding the checkpoint's tokenizer: its own folder, or for a remote checkpoint a copy under
    $XDG_CACHE_HOME/edje/tokenizers named by the files' content, so that loading it again reuses the copy."""
    if "file" in fs.protocol:
        return os.path.join(root, TOKENIZER)
    prefix = f"{root}/{TOKENIZER}/"
    files = {p[len(prefix):]: fs.cat_file(p) for p in fs.find(prefix)}
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                         "edje", "tokenizers")
    folder = os.path.join(cache, digest.hexdigest()[:24])
    if not os.path.isdir(folder):
        os.makedirs(cache, exist_ok=True)
        partial = tempfile.mkdtemp(prefix=".partial-", dir=cache)
        for name, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(partial, name)), exist_ok=True)
            with open(os.path.join(partial, name), "wb") as f:
                f.write(data)
        try:  # a rename is atomic: a reader sees the whole folder or none
            os.rename(partial, folder)
        except OSError:  # another process put the same files there first
            shutil.rmtree(partial, ignore_errors=True)
    return folder


def fast_tokenizer(path: str):
    """The checkpoint's tokenizer as a `tokenizers.Tokenizer` (no truncation, no padding), read in memory; None when
    it has no tokenizer.json (a slow-only tokenizer)."""
    from tokenizers import Tokenizer

    fs, root = fsspec.core.url_to_fs(path)
    file = f"{root}/{TOKENIZER}/{TOKENIZER_FILE}"
    if not fs.exists(file):
        return None
    tok = Tokenizer.from_str(fs.cat_file(file).decode())
    tok.no_truncation()
    tok.no_padding()
    return tok
