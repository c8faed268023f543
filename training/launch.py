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

from edje.schemas.token_table import TableMetadata, expand_paths, read_metadata, read_token_table
from edje.storage.hub import CheckpointNotFound, hub_env
from edje.training.caption_rewrites import VERTICAL, FlipBalance
from edje.training.config import OBJECTIVES, ModelSpec, TrainJobConfig
from edje.training.language_model import pack, resolve_language_model
from edje.training.sampler import CurriculumConfig


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
    square = {}
    if cfg.flip_mode == "square":
        mirrors = [_absolute(p) for p in expand_tables(cfg.mirror_tables or paths)]
        check_mirror_tables(mirrors, meta)
        # Built once over every worker's captions: each worker weighs its rows by the whole run's counts.
        square = {"mirror_paths": mirrors, "flip_balance": FlipBalance(training_captions(paths), VERTICAL)}
    trainer = TorchTrainer(
        _entry,
        train_loop_config={"job": cfg, "meta": meta, "paths": paths,
                           "batches_per_epoch": count_rows(paths) // (cfg.batch_size * cfg.num_workers),
                           "storage": storage, "language_model": language_model, **square},
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


def training_captions(paths: Sequence[str]) -> List[str]:
    """The captions of the tables' training rows (augmented rows left out)."""
    out: List[str] = []
    for p in paths:
        augmented = read_metadata(p).augment is not None
        table, _ = read_token_table(p, columns=["caption"] + (["augment"] if augmented else []))
        out += [c for c, a in zip(table.column("caption").to_pylist(),
                                  table.column("augment").to_pylist() if augmented else [None] * table.num_rows)
                if a is None]
    return out


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
    """The command line shared by the training jobs; defaults differ per job."""
    d = TrainJobConfig(tables=[], storage_path="", name="")
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--tables", nargs="+", required=True, help="raw token tables: files or folders, any fsspec path")
    p.add_argument("--storage-path", required=True, help="where Ray Train keeps checkpoints (local dir or URI)")
    p.add_argument("--name", required=True, help="run name; rerunning the same name resumes from its newest checkpoint")
    p.add_argument("--export", help="copy the final checkpoint (our format, without optimizer state) to this folder, "
                   "local or any fsspec URL such as s3://bucket/edje-c64 (the next job's --adapter / --init / --teacher)")
    p.add_argument("--num-workers", type=int, default=d.num_workers)
    p.add_argument("--use-gpu", action="store_true")
    p.add_argument("--cpus-per-worker", type=float, default=d.cpus_per_worker)
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="per worker")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in total")
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio,
                   help="cosine decay from lr after warm-up down to this share of lr at the last step")
    p.add_argument("--k", type=int, default=d.k, help="hard negatives per sample and direction")
    p.add_argument("--mining", choices=["topk", "sample"], default=d.mining)
    p.add_argument("--mining-temperature", type=float, default=d.mining_temperature)
    p.add_argument("--negatives", choices=["in-batch", "miner"], default=d.negatives,
                   help="in-batch: mined among the batch gathered across workers; miner: POST /v1/negatives")
    p.add_argument("--miner-url", help="base url of the miner service (with --negatives miner)")
    p.add_argument("--batching", choices=["planned", "stream"], default=d.batching,
                   help="planned: shuffled batches composed in each worker (with the cluster curriculum); "
                   "stream: Ray Data streaming with a local shuffle buffer (shards beyond worker memory)")
    p.add_argument("--shuffle-buffer", type=int, default=d.shuffle_buffer, help="rows (stream batching)")
    c = CurriculumConfig()
    p.add_argument("--cluster-fraction", type=float, default=c.max_fraction,
                   help="final share of each batch drawn as clusters of near neighbours (ELIP hard batches)")
    p.add_argument("--cluster-start", type=int, default=c.start, help="step at which clusters start")
    p.add_argument("--cluster-end", type=int, default=c.end, help="step at which the cluster share is full")
    p.add_argument("--cluster-size", type=int, default=c.cluster_size, help="images per neighbour cluster")
    p.add_argument("--objectives", nargs="+", default=list(objectives), choices=list(OBJECTIVES))
    p.add_argument("--loss-weight", nargs=2, action="append", metavar=("OBJECTIVE", "WEIGHT"), default=[],
                   help="weight of one objective (default 1.0)")
    p.add_argument("--flip-mode", choices=["caption", "square"], default=d.flip_mode,
                   help="the flip objective's negatives. caption: each positive against its caption reversed on one "
                   "axis, same image; square: horizontal captions make a square with the image's mirrored copy "
                   "(tables encoded with --augment hflip), vertical ones stay caption-side, weighted so that the "
                   "spatial words alone tell true from flipped no better than chance")
    p.add_argument("--mirror-tables", nargs="+", default=list(d.mirror_tables),
                   help="raw tables encoded with --augment hflip that hold the training images' mirrored copies "
                   "(--flip-mode square; default: the training tables)")
    p.add_argument("--pointer-k", type=float, default=d.pointer_k,
                   help="sharpness of the pointer objective's order loss softplus(k * signed difference)")
    p.add_argument("--mlm-masking", choices=["random", "groups"], default=d.mlm_masking,
                   help="random: BERT's random wordpieces; groups: all words of one attribute group per caption "
                   "(colour, shape, size or spatial words), so that only the image can supply the binding")
    p.add_argument("--mlm-groups", help="JSON file {group: [words]} for --mlm-masking groups "
                   "(default: the sample world's caption vocabulary)")
    p.add_argument("--mlm-group-weight", nargs=2, action="append", metavar=("GROUP", "WEIGHT"), default=[],
                   help="odds of GROUP being the one masked, relative to the others' 1 (--mlm-masking groups)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints)
    p.add_argument("--max-failures", type=int, default=d.max_failures,
                   help="worker-group failures to survive by restarting from the newest checkpoint (-1: any; default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed)
    m = p.add_argument_group("model (ignored with --init)")
    s = ModelSpec()
    m.add_argument("--adapter", choices=["local", "compressed"], default=s.adapter)
    m.add_argument("--num-queries", type=int, default=s.num_queries)
    m.add_argument("--adapter-hidden", type=int, default=s.adapter_hidden)
    m.add_argument("--adapter-heads", type=int, default=s.adapter_heads)
    m.add_argument("--adapter-position", choices=["none", "2d"], default=s.adapter_position,
                   help="2d: add a fixed sine-cosine (row, column) embedding to the backbone's square token grid "
                   "(also added to an --init checkpoint's adapter)")
    m.add_argument("--adapter-position-gain", type=float, default=s.adapter_position_gain,
                   help="initial gain of the 2-D table (unit norm per cell; backbone tokens are ~17 long)")
    m.add_argument("--language-model", help="BERT-family language model: a hub id (e.g. "
                   "microsoft/MiniLM-L12-H384-uncased, the paper's) or a folder; resolved once on the driver and "
                   "shipped to every worker (default: the packaged all-MiniLM-L6-v2)")
    m.add_argument("--encoder-layers", type=int, help="keep only the first N language-model layers")
    m.add_argument("--max-text-tokens", type=int, default=s.max_text_tokens)
    m.add_argument("--word-context", type=int, default=s.word_context,
                   help="odd kernel width of a convolution folding neighbouring caption words into each word's "
                   "input embedding (0 = plain BERT)")
    m.add_argument("--itm-input", choices=["tokens", "global"], default=s.itm_input,
                   help="tokens: BERT over caption + image tokens (EDJE); global: BERT over the caption alone and "
                   "the image as one vector (mean of the adapter's tokens) fused with the text [CLS] (a baseline)")
    m.add_argument("--random-bert", nargs="+", metavar="FIELD=INT",
                   help="random-init BERT of this shape (e.g. hidden_size=128 num_hidden_layers=4 "
                   "num_attention_heads=4 intermediate_size=512) with the language model's tokenizer")
    r = p.add_argument_group("relations (also applied to --init: its weights kept, the new parts starting at 0)")
    r.add_argument("--image-positions", choices=["after_text", "fixed"], default=s.image_positions,
                   help="fixed: image token i keeps one BERT position whatever the caption's length")
    r.add_argument("--relation-roles", action="store_true",
                   help="relation / subject / object role embeddings from a parse of spatial prepositions")
    r.add_argument("--role-parse", choices=["vocabulary", "english"], default=s.role_parse,
                   help="where the roles come from. vocabulary: a parse by the sample world's words (a diagnostic, "
                   "recorded as role_vocabulary); english: a rule of English, no word list of any world (default: "
                   "vocabulary for a new model, the --init checkpoint's own roles)")
    r.add_argument("--route-layer", type=int, default=s.route_layer,
                   help="after this many layers, each relation word receives P(subject - object) (0: off)")
    r.add_argument("--ground-layer", type=int, default=s.ground_layer,
                   help="after this many layers, a head regresses grounded words' object centres (0: off; "
                   "the ground objective and --grounding train it)")
    r.add_argument("--pointer", action="store_true",
                   help="the pointer: each relation's subject and object phrase, from its own words, points at the "
                   "image cells; its expected cell joins the phrase's states where the route reads them (needs "
                   "--role-parse english, --route-layer and a local adapter; the pointer objective trains it)")
    r.add_argument("--grounding", nargs="+", default=[],
                   help="annotation files whose entries carry `grounding` (the ground objective)")
    p.add_argument("--init", help="start from this EDJE checkpoint")
    p.add_argument("--init-encoder-from", help="copy only the joint encoder from this EDJE checkpoint")
    p.add_argument("--teacher", help="frozen teacher EDJE checkpoint (distill objective)")
    p.add_argument("--ray-address", default=None, help="Ray cluster (default: $RAY_ADDRESS, else a local instance)")
    return p


def config_from_args(a: argparse.Namespace) -> TrainJobConfig:
    """TrainJobConfig from parsed arguments."""
    spec = ModelSpec(adapter=a.adapter, num_queries=a.num_queries, adapter_hidden=a.adapter_hidden,
                     adapter_heads=a.adapter_heads, adapter_position=a.adapter_position,
                     adapter_position_gain=a.adapter_position_gain, language_model=a.language_model,
                     encoder_layers=a.encoder_layers, max_text_tokens=a.max_text_tokens, word_context=a.word_context,
                     itm_input=a.itm_input, bert_config=_bert_fields(a.random_bert),
                     image_positions=a.image_positions, relation_roles=a.relation_roles, role_parse=a.role_parse,
                     route_layer=a.route_layer, ground_layer=a.ground_layer, pointer=a.pointer)
    weights = dict(TrainJobConfig(tables=[], storage_path="", name="").loss_weights)
    weights.update({k: float(v) for k, v in a.loss_weight})
    return TrainJobConfig(
        tables=list(a.tables), storage_path=a.storage_path, name=a.name, model=spec, init_checkpoint=_absolute(a.init),
        init_encoder_from=_absolute(a.init_encoder_from), teacher_checkpoint=_absolute(a.teacher),
        grounding=tuple(_absolute(g) for g in a.grounding), objectives=tuple(a.objectives),
        flip_mode=a.flip_mode, mirror_tables=tuple(a.mirror_tables), pointer_k=a.pointer_k,
        loss_weights=tuple(sorted(weights.items())), num_workers=a.num_workers, use_gpu=a.use_gpu,
        cpus_per_worker=a.cpus_per_worker, batch_size=a.batch_size, epochs=a.epochs, max_steps=a.max_steps,
        lr=a.lr, weight_decay=a.weight_decay, warmup_steps=a.warmup_steps, min_lr_ratio=a.min_lr_ratio, k=a.k,
        mining=a.mining, mining_temperature=a.mining_temperature, negatives=a.negatives, miner_url=a.miner_url,
        mlm_masking=a.mlm_masking, mlm_groups=a.mlm_groups,
        mlm_group_weights=tuple((g, float(w)) for g, w in a.mlm_group_weight),
        batching=a.batching, shuffle_buffer=a.shuffle_buffer,
        curriculum=CurriculumConfig(a.cluster_fraction, a.cluster_start, a.cluster_end, a.cluster_size),
        checkpoint_every=a.checkpoint_every, log_every=a.log_every,
        keep_checkpoints=a.keep_checkpoints, max_failures=a.max_failures, seed=a.seed)


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


def _absolute(path: Optional[str]) -> Optional[str]:
    """A local path made absolute: Ray Train workers run in another working directory than the driver."""
    if path is None or "://" in path:
        return path
    return os.path.abspath(path)


def _bert_fields(items) -> Optional[tuple]:
    if not items:
        return None
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise SystemExit(f"--random-bert takes FIELD=INT items, got {item!r}")
        out.append((key, int(value)))
    return tuple(sorted(out))


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

