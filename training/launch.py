"""Launch a training run on Ray Train (TorchTrainer + DDP) over raw token tables read with Ray Data.

Shared by jobs/pretrain.py, jobs/finetune.py and jobs/distill.py: one parser, one launcher;
the jobs differ only in their objectives and defaults.
"""
from __future__ import annotations

import argparse
import math
import os
from typing import List, Optional, Sequence, Tuple

import fsspec

from edje.schemas.cli_options import add_options, from_args
from edje.schemas.token_table import TableMetadata, expand_paths, read_metadata, read_token_table
from edje.storage.hub import CheckpointNotFound, hub_env
from edje.training.attribute_swaps import AttributeSwaps
from edje.training.caption_rewrites import ORIENTATION, VERTICAL, FlipBalance
from edje.training.config import TrainJobConfig
from edje.training.config import absolute_path as _absolute
from edje.training.language_model import pack, resolve_language_model
from edje.training.noun_swaps import NounSwaps


def expand_tables(paths: Sequence[str]) -> List[str]:
    """Table files named directly, or every *.parquet under a named folder (any fsspec path), sorted."""
    return expand_paths(paths)


def check_tables(paths: Sequence[str]) -> TableMetadata:
    """All tables must be raw and made by one backbone/codec; returns their common metadata."""
    first: Optional[TableMetadata] = None
    for p in paths:
        meta = read_metadata(p)
        if first is None:
            meta.check(p, kind="raw")
            first = meta
        else:
            meta.check(p, kind="raw", backbone=first.backbone, pretrained=first.pretrained,
                       backbone_revision=first.backbone_revision, pretrained_sha256=first.pretrained_sha256,
                       feature_layer=first.feature_layer, num_tokens=first.num_tokens, width=first.width,
                       quantization=first.quantization, embed_dim=first.embed_dim, group_size=first.group_size)
    assert first is not None
    return first


def read_dataset(paths: Sequence[str]):
    """Ray Data dataset over the tables (local paths as is; other fsspec paths through an fsspec handler)."""
    import ray.data
    remote = [p for p in paths if "://" in p and not p.startswith("file://")]
    if not remote:
        return ray.data.read_parquet(list(paths))
    import pyarrow.fs as pafs
    fs, _ = fsspec.core.url_to_fs(remote[0])
    stripped = [fsspec.core.url_to_fs(p)[1] for p in paths]
    return ray.data.read_parquet(stripped, filesystem=pafs.PyFileSystem(pafs.FSSpecHandler(fs)))


def run(cfg: TrainJobConfig, language_model=None):
    """Fit on Ray Train; returns the ray.train.Result (its .checkpoint is the newest checkpoint). `language_model`:
    an object ref of the language model's files (training/language_model.py), which the workers start from."""
    import ray.train
    from ray.train.torch import TorchTrainer

    paths = expand_tables(cfg.tables)
    meta = check_tables(paths)
    if meta.augment is not None and cfg.batching != "planned":
        raise ValueError("tables with augmented rows need batching='planned' (the rows are set apart per worker)")
    storage = cfg.storage_path if "://" in cfg.storage_path else os.path.abspath(cfg.storage_path)
    flips = {}
    if cfg.flip_mode == "square":
        mirrors = [_absolute(p) for p in expand_tables(cfg.mirror_tables or paths)]
        check_mirror_tables(mirrors, meta)
        # Built once over every worker's captions: each worker weighs its rows by the whole run's counts.
        flips = {"mirror_paths": mirrors, "flip_balance": FlipBalance(training_captions(paths), VERTICAL)}
    elif "flip" in cfg.objectives:
        flips = {"flip_balance": FlipBalance(training_captions(paths), axis=None)}
    if "noun_swap" in cfg.objectives:
        # Like the flip balance, counted once over every worker's captions.
        flips["noun_swaps"] = NounSwaps(*training_captions(paths, with_image_ids=True))
    if "attribute_swap" in cfg.objectives:
        flips["attribute_swaps"] = AttributeSwaps(training_captions(paths))
    if "orientation" in cfg.objectives:
        flips["orientation_balance"] = FlipBalance(training_captions(paths), ORIENTATION)
    trainer = TorchTrainer(
        _entry,
        train_loop_config={"job": cfg, "meta": meta, "paths": paths,
                           "batches_per_epoch": count_rows(paths) // (cfg.batch_size * cfg.num_workers),
                           "storage": storage, "language_model": language_model, **flips},
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                               resources_per_worker={"CPU": cfg.cpus_per_worker}),
        run_config=ray.train.RunConfig(name=cfg.name, storage_path=storage,
                                       checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
                                       failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures)),
        datasets={"train": read_dataset(paths)},
    )
    return trainer.fit()


def check_mirror_tables(paths: Sequence[str], meta: TableMetadata) -> None:
    """Mirror tables must hold mirrored rows of the training tables' backbone and token shape."""
    if not any(read_metadata(p).augment == "hflip" for p in paths):
        raise ValueError("the flip square needs mirrored images: encode the training images with --augment hflip "
                         "and train on those tables or name them with --mirror-tables")
    for p in paths:
        read_metadata(p).check(p, kind="raw", backbone=meta.backbone, pretrained_sha256=meta.pretrained_sha256,
                               feature_layer=meta.feature_layer, num_tokens=meta.num_tokens, width=meta.width)


def training_captions(paths: Sequence[str], with_image_ids: bool = False):
    """The captions of the tables' training rows (augmented rows left out); with_image_ids: (captions, image ids)."""
    out: List[str] = []
    ids: List[str] = []
    for p in paths:
        augmented = read_metadata(p).augment is not None
        table, _ = read_token_table(p, columns=["caption", "image_id"] + (["augment"] if augmented else []))
        keep = [a is None for a in (table.column("augment").to_pylist() if augmented else [None] * table.num_rows)]
        out += [c for c, k in zip(table.column("caption").to_pylist(), keep) if k]
        ids += [i for i, k in zip(table.column("image_id").to_pylist(), keep) if k]
    return (out, ids) if with_image_ids else out


def count_rows(paths: Sequence[str]) -> int:
    """Rows in the tables, from their Parquet footers (no data read)."""
    import pyarrow.parquet as pq
    total = 0
    for p in paths:
        fs, path = fsspec.core.url_to_fs(p)
        with fs.open(path, "rb") as f:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


def checkpoint_candidates(storage: str, name: str) -> List[Tuple[int, str]]:
    """(step, path) of the run's checkpoints that have all their files, newest first.

    Ray Train restores from its own snapshot, which a hard kill can leave one checkpoint
    behind (or missing); the workers take whichever is newer and loads.
    """
    import json
    fs, root = fsspec.core.url_to_fs(f"{storage.rstrip('/')}/{name}")
    proto = storage.split("://")[0] + "://" if "://" in storage else ""
    if not fs.isdir(root):
        return []
    found = []
    for d in fs.ls(root, detail=False):
        base = d.rstrip("/").rsplit("/", 1)[-1]
        if not base.startswith("checkpoint_"):
            continue
        if not all(fs.exists(f"{d}/{f}") for f in ("config.json", "model.safetensors", "optimizer.pt")):
            continue
        try:
            with fs.open(f"{d}/config.json") as f:
                step = int(json.load(f)["position"]["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a config.json cut short by the kill
        found.append((step, proto + d if proto else d))
    return sorted(found, reverse=True)


def _entry(config: dict) -> None:
    # Imported inside the worker so that the driver never builds a model.
    from edje.training.loop import train_loop_per_worker
    # Scanned whenever a worker group starts, so that a group restarted after a failure (--max-failures)
    # resumes from the checkpoints written since launch, also where Ray's own snapshot lags behind them.
    train_loop_per_worker({**config, "resume_candidates": checkpoint_candidates(config["storage"], config["job"].name)})


def export_checkpoint(result, target: str) -> str:
    """Copy the run's newest checkpoint (model files; the optimizer state stays behind) to `target`, a local folder or
    any fsspec URL (s3://bucket/edje-c64: where the next job of a cluster reads it)."""
    if result.checkpoint is None:
        raise RuntimeError("the run reported no checkpoint")
    fs, root = fsspec.core.url_to_fs(target)
    with result.checkpoint.as_directory() as d:
        fs.makedirs(root, exist_ok=True)
        for folder, _, names in os.walk(d):
            for name in names:
                if name == "optimizer.pt" and folder == d:
                    continue
                rel = os.path.relpath(os.path.join(folder, name), d).replace(os.sep, "/")
                fs.makedirs(f"{root}/{rel}".rsplit("/", 1)[0], exist_ok=True)
                fs.put_file(os.path.join(folder, name), f"{root}/{rel}")
    return target


def build_parser(description: str, lr: float, objectives: Tuple[str, ...]) -> argparse.ArgumentParser:
    """The command line shared by the training jobs (TrainJobConfig's options); defaults differ per job."""
    p = argparse.ArgumentParser(description=description)
    add_options(p, TrainJobConfig, defaults={"lr": lr, "objectives": list(objectives)})
    p.add_argument("--export", help="copy the final checkpoint (our format, without optimizer state) to this folder, "
                   "local or any fsspec URL such as s3://bucket/edje-c64 (the next job's --adapter / --init / --teacher)")
    p.add_argument("--ray-address", default=None, help="Ray cluster (default: $RAY_ADDRESS, else a local instance)")
    return p


def config_from_args(a: argparse.Namespace) -> TrainJobConfig:
    """TrainJobConfig from parsed arguments."""
    return from_args(TrainJobConfig, a)


def _language_model_files(cfg: TrainJobConfig, job: str) -> Optional[dict]:
    """The named language model's files, resolved once here (exit with one line when it cannot be had); None when
    the run needs none (it starts from a checkpoint) or uses the packaged default, which every node has."""
    spec = cfg.model
    if spec.language_model is None or cfg.init_checkpoint or cfg.init_encoder_from:
        return None
    try:
        lm = resolve_language_model(spec.language_model)
        files = pack(lm.folder, weights=spec.bert_config is None)
    except CheckpointNotFound as e:
        raise SystemExit(f"[{job}] {e}") from None
    where = f" at {lm.revision}" if lm.revision else ""
    print(f"[{job}] language model {lm.name}{where}: {len(files)} files, {sum(map(len, files.values())) >> 20} MiB "
          f"shipped to the workers", flush=True)
    return files


def main(argv, description: str, lr: float, objectives: Tuple[str, ...], adjust=None) -> None:
    """Parse, start Ray (the given cluster, or a local one), fit, optionally export, print the result."""
    import ray
    a = build_parser(description, lr, objectives).parse_args(argv)
    cfg = config_from_args(a)
    if adjust is not None:
        cfg = adjust(cfg, a)
    address = a.ray_address or os.environ.get("RAY_ADDRESS") or "local"
    files = _language_model_files(cfg, "train")
    # The workers reach the hub (or stay offline) as this driver does: its HF_* variables, never a forced mode.
    env = {"NO_ALBUMENTATIONS_UPDATE": os.environ.get("NO_ALBUMENTATIONS_UPDATE", "1"), **hub_env()}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + os.environ.get("PYTHONPATH", "")
    kwargs = {}
    if address == "local":
        # Ray Data's read tasks need a CPU beside the training workers, or the shard never fills.
        kwargs["num_cpus"] = max(os.cpu_count() or 1, int(math.ceil(cfg.num_workers * cfg.cpus_per_worker)) + 1)
    ray.init(address=address, runtime_env={"env_vars": env}, include_dashboard=False, log_to_driver=True, **kwargs)
    result = run(cfg, ray.put(files) if files is not None else None)
    print(f"final metrics: {result.metrics}")
    if result.checkpoint is not None:
        print(f"newest checkpoint: {result.checkpoint.path}")
    if a.export:
        print(f"exported to {export_checkpoint(result, a.export)}")

