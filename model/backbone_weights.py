"""Where a backbone's weights come from, resolved to local files and pinned to what was loaded.

Three ways to name them, as open_clip users do:
- an open_clip registry name and a pretrained tag (`ViT-L-16-SigLIP2-384` + `webli`): the tag's file on the hub;
- `hf-hub:ORG/NAME`: the repository's `open_clip_config.json` and weights (no tag);
- a registry name and a local weights file (or an fsspec URL of one).
`resolve` downloads what is needed through `huggingface_hub`, so the user's environment decides online or offline
(HF_HUB_OFFLINE, HF_HOME, HF_ENDPOINT, HF_TOKEN). It returns what open_clip is given (a registry name or the
repository's `local-dir:` snapshot, a weights file, the tag's preprocessing) and what tables record: the hub
commit and the weights' sha256. A config that records a commit loads exactly that commit; one that records a
sha256 refuses other bytes.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from edje.model.backbone_registry import open_clip_registry
from edje.schemas.config import BackboneConfig
from edje.schemas.weights import check_weights, find_weights, weights_sha256
from edje.storage.hub import CheckpointNotFound, hub_file, hub_snapshot, snapshot_commit, unavailable

HF_HUB = "hf-hub:"
CONFIG_FILE = "open_clip_config.json"
# The weights file of an open_clip hub repository, in open_clip's own order of preference.
HUB_WEIGHTS: Tuple[str, ...] = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# What an HF tokenizer named by a repository's text config reads from its folder.
TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt", "spiece.model", "*.tiktoken")
PREPROCESS_KEYS = ("mean", "std", "interpolation", "resize_mode")


@dataclass(frozen=True)
class ResolvedBackbone:
    """What open_clip is given to build a backbone, and what was loaded."""

    open_clip_name: str  # a registry name, or "local-dir:<snapshot>" of an hf-hub repository
    weights_file: Optional[str]  # None: random weights
    revision: Optional[str]  # hub commit of the weights (or of the repository's config when random)
    sha256: Optional[str]  # of weights_file
    model_cfg: Dict = field(default_factory=dict)  # open_clip's model config (vision_cfg, text_cfg, ...)
    preprocess: Dict = field(default_factory=dict)  # a tag's preprocessing (mean, std, ...), over the config's


def is_hub_name(name: str) -> bool:
    """Whether `name` is an open_clip `hf-hub:ORG/NAME` repository."""
    return name.startswith(HF_HUB)


def resolve(cfg: BackboneConfig, fetch_weights: bool = True) -> ResolvedBackbone:
    """The local files `cfg` names (downloaded, or read from the hub cache), checked against its recorded sha256.

    fetch_weights=False only checks that the weights can be had (their commit is found, nothing large is
    downloaded; `weights_file` is then None): a server checks this on its driver before replicas start."""
    what = f"backbone {cfg.name}" + (f" (pretrained {cfg.pretrained})" if cfg.pretrained else "")
    try:
        resolved = _resolve(cfg, fetch_weights)
    except CheckpointNotFound:
        raise
    except Exception as e:
        err = unavailable(what, e)
        if err is None:
            raise
        raise err from e
    if resolved.weights_file is not None:
        check_weights(resolved.weights_file, cfg.weights_sha256, what)
    return resolved


def pin(cfg: BackboneConfig) -> BackboneConfig:
    """`cfg` with the hub commit and the sha256 of the weights it resolves to: every later load gets the same bytes."""
    r = resolve(cfg)
    return dataclasses.replace(cfg, revision=r.revision or cfg.revision, weights_sha256=r.sha256 or cfg.weights_sha256)


def model_config(name: str, revision: Optional[str] = None) -> Dict:
    """open_clip's model config of a registry name or an hf-hub repository (its open_clip_config.json)."""
    if not is_hub_name(name):
        return open_clip_registry().get_model_config(name) or {}
    try:
        path, _ = hub_file(name[len(HF_HUB):], CONFIG_FILE, revision)
    except Exception as e:
        err = unavailable(f"backbone {name}", e)
        if err is None:
            raise
        raise err from e
    return _read_config(path)[0]


def _resolve(cfg: BackboneConfig, fetch_weights: bool) -> ResolvedBackbone:
    if is_hub_name(cfg.name):
        return _hub_repository(cfg, fetch_weights)
    if cfg.random_weights or not cfg.pretrained:
        return ResolvedBackbone(cfg.name, None, None, None)
    if "://" in cfg.pretrained:
        path = _fetch(cfg.pretrained)
        return ResolvedBackbone(cfg.name, path, None, weights_sha256(path))
    path = find_weights(cfg.pretrained)
    if path and os.path.isfile(path):
        return ResolvedBackbone(cfg.name, path, None, weights_sha256(path))
    if os.path.sep in cfg.pretrained:
        raise FileNotFoundError(f"backbone checkpoint {cfg.pretrained} does not exist")
    return _tag(cfg, fetch_weights)


def _hub_repository(cfg: BackboneConfig, fetch_weights: bool) -> ResolvedBackbone:
    """An open_clip hub repository: its config, its weights (unless random) and its tokenizer's files, at one commit."""
    repo = cfg.name[len(HF_HUB):]
    config_path, commit = hub_file(repo, CONFIG_FILE, cfg.revision)
    model_cfg, preprocess = _read_config(config_path)
    folder = f"local-dir:{os.path.dirname(config_path)}"
    if cfg.random_weights:
        return ResolvedBackbone(folder, None, commit, None, model_cfg, preprocess)
    if not fetch_weights:
        _first_file(repo, HUB_WEIGHTS, commit, fetch=False)
        return ResolvedBackbone(folder, None, commit, None, model_cfg, preprocess)
    weights = _first_file(repo, HUB_WEIGHTS, commit, fetch=True)
    if "hf_tokenizer_name" in model_cfg.get("text_cfg", {}):  # open_clip reads it from the local-dir folder
        hub_snapshot(repo, commit, allow_patterns=list(TOKENIZER_FILES))
    return ResolvedBackbone(folder, weights, commit, weights_sha256(weights), model_cfg, preprocess)


def _tag(cfg: BackboneConfig, fetch_weights: bool) -> ResolvedBackbone:
    """An open_clip registry tag: the file its pretrained config names, from the hub (pinned) or its URL."""
    from open_clip.pretrained import download_pretrained

    open_clip = open_clip_registry()

    pcfg = open_clip.get_pretrained_cfg(cfg.name, cfg.pretrained)
    if not pcfg:
        tags = open_clip.list_pretrained_tags_by_model(cfg.name)
        raise ValueError(f"backbone {cfg.name}: pretrained {cfg.pretrained!r} is neither a weights file nor an "
                         f"open_clip tag of it (its tags: {', '.join(tags) or 'none'})")
    preprocess = {k: pcfg[k] for k in PREPROCESS_KEYS if pcfg.get(k) is not None}
    hub = pcfg.get("hf_hub", "")
    if hub:
        # open_clip's convention: "org/name/" (its default file) or "org/name/file".
        model_id, filename = os.path.split(hub)
        names = _safe_first(filename or "open_clip_pytorch_model.bin")
        if not fetch_weights:
            commit = _first_file(model_id, names, cfg.revision, fetch=False)
            return ResolvedBackbone(cfg.name, None, commit, None, {}, preprocess)
        path = _first_file(model_id, names, cfg.revision, fetch=True)
        return ResolvedBackbone(cfg.name, path, snapshot_commit(os.path.dirname(path)), weights_sha256(path), {},
                                preprocess)
    if not fetch_weights:  # a URL: nothing to check short of downloading it
        return ResolvedBackbone(cfg.name, None, None, None, {}, preprocess)
    path = download_pretrained(pcfg)  # a URL or a file: no hub commit
    return ResolvedBackbone(cfg.name, path, None, weights_sha256(path), {}, preprocess)


def _first_file(repo: str, names: Tuple[str, ...], revision: Optional[str], fetch: bool) -> str:
    """The first of `names` the repository has at `revision`: its local path (or, fetch=False, its commit)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    last: Optional[Exception] = None
    for name in names:
        try:
            if fetch:
                return hub_file(repo, name, revision)[0]
            info = hf_hub_download(repo_id=repo, filename=name, revision=revision, dry_run=True)
            return info.commit_hash
        except RemoteEntryNotFoundError as e:
            last = e
    assert last is not None
    raise last


def _safe_first(filename: str) -> Tuple[str, ...]:
    """A safetensors twin of a pickled weights file first, as open_clip prefers it."""
    if filename == "open_clip_pytorch_model.bin":
        return "open_clip_model.safetensors", filename
    if filename.endswith((".bin", ".pth")):
        return filename[:-4] + ".safetensors", filename
    return (filename,)


def _read_config(path: str) -> Tuple[Dict, Dict]:
    """(model_cfg, preprocess_cfg) of an open_clip_config.json."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if "model_cfg" not in data:
        raise ValueError(f"{path} has no model_cfg: not an open_clip repository")
    return data["model_cfg"], data.get("preprocess_cfg", {})


def _fetch(url: str) -> str:
    """Copy a remote (fsspec) checkpoint to a local cache file; open_clip loads local files."""
    import hashlib
    import tempfile
    from pathlib import Path

    import fsspec

    local = Path(tempfile.gettempdir()) / "edje-ckpt" / hashlib.sha1(url.encode()).hexdigest() / Path(url).name
    if not local.exists():
        local.parent.mkdir(parents=True, exist_ok=True)
        fsspec.core.url_to_fs(url)[0].get(url, str(local))
    return str(local)
