"""The Ray Train worker loop shared by pretraining, fine-tuning and distillation.

Each worker reads its shard of the raw token tables (Ray Data), gathers the batch's embeddings,
captions and tokens from all workers, mines k hard negatives per sample (or asks the miner
service), and steps the DDP-wrapped objectives. Rank 0 writes our checkpoint format
(model/edje.py save_checkpoint + optimizer state + position) every N steps and at each epoch's
end, through ray.train.report; a rerun of the same run resumes from the newest one.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist

from edje.model.content_words import ContentWords
from edje.model.edje import EDJEModel, load_checkpoint, save_checkpoint
from edje.model.text_augment import augment_batch
from edje.schemas.annotations import load_grounding
from edje.schemas.token_table import TableMetadata, vector_matrix
from edje.training.batches import MirrorLookup, TrainBatch, decode_batch, drop_augmented, gather_batch
from edje.training.config import TrainJobConfig
from edje.training.language_model import unpack
from edje.training.masking import PieceGroups, WordGroups
from edje.training.mining import MinerConfig
from edje.training.model_init import build_model
from edje.training.negatives import MinerNegatives, Negatives, TokenLookup, in_batch_negatives
from edje.training.objectives import EDJEObjectives, TeacherPass, teacher_scores
from edje.training.sampler import BatchPlanner

OPTIMIZER = "optimizer.pt"


@dataclass
class Position:
    """Where a run stands: optimizer steps taken, current epoch, batches of that epoch consumed."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0


def learning_rate(cfg: TrainJobConfig, step: int, total_steps: int) -> float:
    """Linear warm-up over warmup_steps, then cosine decay to min_lr_ratio x lr at total_steps.

    Step-based, so the schedule is the same whatever an epoch's length (an epoch-based decay
    halved the rate every few hundred steps on a small table)."""
    warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, max(0.0, (step - cfg.warmup_steps) / span))
    floor = cfg.min_lr_ratio
    return cfg.lr * warm * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def format_duration(seconds: float) -> str:
    """Seconds as H:MM:SS (hours unbounded, negatives as zero)."""
    s = int(round(max(0.0, seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def progress_text(step: int, total: Optional[int], steps_run: int, seconds: float) -> str:
    """`step N/total (P%), S s/step, eta H:MM:SS`, timed by the mean of the `steps_run` steps that took `seconds`."""
    parts = [f"step {step}/{total} ({min(100, 100 * step // total)}%)" if total else f"step {step}"]
    if steps_run > 0:
        # The mean since this process started (or resumed): a resumed run's earlier steps ran elsewhere.
        per_step = seconds / steps_run
        parts.append(f"{per_step:.2f} s/step")
        if total:
            parts.append(f"eta {format_duration(per_step * max(0, total - step))}")
    return ", ".join(parts)


def build_optimizer(model: torch.nn.Module, cfg: TrainJobConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (biases, norms and the adapter queries are exempt)."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and "norm" not in name.lower() and not name.endswith("query") else rest).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr)


def save_training_checkpoint(model: EDJEModel, optimizer: torch.optim.Optimizer, pos: Position,
                             metrics: Dict, directory: str, job: Optional[TrainJobConfig] = None) -> None:
    """Our checkpoint format plus the optimizer state, the run position and the training job's options."""
    extra = {"position": asdict(pos), "metrics": metrics, **({"training": asdict(job)} if job is not None else {})}
    save_checkpoint(model, directory, extra=extra)
    torch.save(optimizer.state_dict(), os.path.join(directory, OPTIMIZER))


def _load_training_checkpoint(directory: str):
    """(model, position, optimizer state) from one of our training checkpoints (any fsspec path)."""
    import fsspec
    model = load_checkpoint(directory).train()
    fs, root = fsspec.core.url_to_fs(directory)
    with fs.open(f"{root}/config.json") as f:
        pos = Position(**json.load(f).get("position", {}))
    with fs.open(f"{root}/{OPTIMIZER}", "rb") as f:
        # weights_only: tensors and plain containers only, never arbitrary pickled objects
        opt_state = torch.load(f, map_location="cpu", weights_only=True)
    return model, pos, opt_state


def resume_state(ray_checkpoint, candidates) -> Optional[tuple]:
    """The newest loadable state: Ray's restored checkpoint or a newer complete one found in storage."""
    states = []
    if ray_checkpoint is not None:
        with ray_checkpoint.as_directory() as d:
            states.append(_load_training_checkpoint(d))
    best = states[0][1].step if states else -1
    for step, path in candidates:  # newest first
        if step <= best:
            break
        try:
            return _load_training_checkpoint(path)
        except Exception as e:
            print(f"skipping unreadable checkpoint {path}: {e}", flush=True)
    return states[0] if states else None


def _mean_across_workers(values: Dict[str, float], device: torch.device) -> Dict[str, float]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    keys = sorted(values)
    # On the worker's device: NCCL reduces CUDA tensors only.
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return {k: float(v) / dist.get_world_size() for k, v in zip(keys, t.tolist())}


def _min_across_workers(value: int, device: torch.device) -> int:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def load_shard(shard) -> pa.Table:
    """A worker's whole shard of the raw tables, in a deterministic order (image id, caption).

    Held as stored (token blobs, fp16 or coarser) so that batches can be composed freely and a
    resumed run rebuilds the same ones; 16 KB a row for 64 x 128 fp16 tokens."""
    parts = [pa.table(b) if not isinstance(b, pa.Table) else b
             for b in shard.iter_batches(batch_size=4096, batch_format="pyarrow")]
    return order_rows(drop_augmented(pa.concat_tables(parts)))


def order_rows(table: pa.Table) -> pa.Table:
    """A shard's rows in the order batches are planned over (image id, caption): the same on every run."""
    return table.combine_chunks().sort_by([("image_id", "ascending"), ("caption", "ascending")])


def planned_batches(table: pa.Table, planner: BatchPlanner, num_batches: int,
                    pos: Position) -> Iterator[Tuple[int, pa.Table]]:
    """(index in epoch, rows) of the current epoch's batches, from the one not yet consumed."""
    first_step = pos.step - pos.batch_in_epoch
    for i, rows in enumerate(planner.epoch(pos.epoch, first_step, num_batches)):
        if i >= pos.batch_in_epoch:
            yield i, table.take(pa.array(rows))


def streamed_batches(cfg: TrainJobConfig, shard, pos: Position) -> Iterator[Tuple[int, pa.Table]]:
    """(index in epoch, rows) streamed from Ray Data with a local shuffle buffer, for shards beyond RAM."""
    batches = shard.iter_batches(batch_size=cfg.batch_size, batch_format="pyarrow", drop_last=True,
                                 local_shuffle_buffer_size=cfg.shuffle_buffer, local_shuffle_seed=cfg.seed + pos.epoch)
    for i, raw in enumerate(batches):
        if i >= pos.batch_in_epoch:  # data position after a resume: skip what the checkpointed run consumed
            yield i, raw


def train_loop_per_worker(config: dict) -> None:
    """Ray Train entry: config = {"job": TrainJobConfig, "meta": TableMetadata}."""
    import ray.train
    import ray.train.torch

    cfg: TrainJobConfig = config["job"]
    meta: TableMetadata = config["meta"]
    if config.get("language_model") is not None:
        # The driver resolved the language model once and shipped its files: this node needs no copy of its own.
        folder = unpack(ray.get(config["language_model"]))
        cfg = replace(cfg, model=replace(cfg.model, language_model=folder))
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    torch.manual_seed(cfg.seed + rank)
    torch.set_num_threads(max(1, int(round(cfg.cpus_per_worker))))
    device = ray.train.torch.get_device()

    resume = resume_state(ray.train.get_checkpoint(), config.get("resume_candidates", []))
    if resume is not None:
        model, pos, opt_state = resume
        print(f"[rank {rank}] resumed from step {pos.step} (epoch {pos.epoch}, batch {pos.batch_in_epoch})", flush=True)
    else:
        pos, opt_state = Position(), None
        model = build_model(cfg.model, meta, cfg.init_checkpoint, cfg.init_encoder_from, cfg.init_on_new_backbone)
    teacher = None
    route_mirror = "route_mirror" in cfg.objectives
    teacher_route = "route_distill" in cfg.objectives or route_mirror
    teacher_cells = "cell_recovery" in cfg.objectives
    if "distill" in cfg.objectives or teacher_route or teacher_cells:
        teacher = load_checkpoint(cfg.teacher_checkpoint).to(device).eval().requires_grad_(False)
    weights = {k: float(v) for k, v in cfg.loss_weights}
    groups = None
    if cfg.mlm_masking == "groups":
        groups = PieceGroups(WordGroups.load(cfg.mlm_groups) if cfg.mlm_groups else WordGroups.sample_world(),
                             model.encoder.tokenizer, weights=dict(cfg.mlm_group_weights))
    elif cfg.mlm_masking == "content":
        groups = ContentWords(model.encoder.tokenizer)
    grounding = {k: v for path in cfg.grounding for k, v in load_grounding(path).items()} if "ground" in cfg.objectives else None
    objectives = EDJEObjectives(model, cfg.objectives, weights, groups, grounding, cfg.flip_mode,
                                config.get("flip_balance"), cfg.pointer_k, align_temperature=cfg.align_temperature,
                                noun_swaps=config.get("noun_swaps"), orientation_balance=config.get("orientation_balance"),
                                attribute_swaps=config.get("attribute_swaps"),
                                first_stage_weight=cfg.itm_first_stage_weight, seed=cfg.seed * 1000 + rank + pos.step)
    mirrors = MirrorLookup(config["mirror_paths"]) if cfg.flip_mode == "square" else None
    # Heads that an objective set leaves unused (MLM, recovery when fine-tuning) get no gradient.
    wrapped = ray.train.torch.prepare_model(objectives, parallel_strategy_kwargs={"find_unused_parameters": True})
    optimizer = build_optimizer(objectives, cfg)
    if opt_state is not None:
        optimizer.load_state_dict(opt_state)

    miner_cfg = MinerConfig(k=cfg.k, strategy=cfg.mining, temperature=cfg.mining_temperature)
    generator = torch.Generator().manual_seed(cfg.seed * 1000 + rank + pos.step)
    miner = MinerNegatives(cfg.miner_url, cfg.k, TokenLookup(config["paths"])) if cfg.negatives == "miner" else None
    shard = ray.train.get_dataset_shard("train")
    sums: Dict[str, float] = {}
    count, started, last_metrics = 0, time.time(), {}

    def report(checkpoint_due: bool) -> None:
        nonlocal sums, count, last_metrics
        metrics = _mean_across_workers({k: v / max(count, 1) for k, v in sums.items()}, device)
        metrics.update(step=pos.step, epoch=pos.epoch, lr=learning_rate(cfg, pos.step, total_steps),
                       elapsed_s=round(time.time() - started, 1))
        last_metrics, sums, count = metrics, {}, 0
        if rank == 0:
            row = json.dumps({k: round(v, 4) if isinstance(v, float) and k != "lr" else v for k, v in metrics.items()})
            # Progress leads the line for people waiting; the JSON ends it, whole, for scripts that read it.
            timing = progress_text(pos.step, known_total, pos.step - first_step, time.time() - loop_started)
            print(f"{timing} {row}", flush=True)
        if checkpoint_due:
            with tempfile.TemporaryDirectory() as tmp:
                checkpoint = None
                if rank == 0:
                    save_training_checkpoint(model, optimizer, pos, metrics, tmp, cfg)
                    checkpoint = ray.train.Checkpoint.from_directory(tmp)
                ray.train.report(metrics, checkpoint=checkpoint)
        else:
            ray.train.report(metrics)

    def done() -> bool:
        return cfg.max_steps is not None and pos.step >= cfg.max_steps

    planner, table, per_epoch = None, None, None
    if cfg.batching == "planned":
        table = load_shard(shard)
        planner = BatchPlanner(table.column("image_id").to_pylist(), vector_matrix(table.column("image_embedding")),
                               cfg.batch_size, cfg.curriculum, cfg.seed * 7919 + rank)
        # DDP needs the same number of steps on every worker.
        per_epoch = _min_across_workers(planner.batches_per_epoch, device)
        if per_epoch < 1:
            raise ValueError(f"a worker holds {planner.num_images} images, fewer than one batch of {cfg.batch_size}")
    # The schedule's length: the whole run, whichever of epochs and max_steps ends it first.
    epoch_steps = per_epoch if per_epoch is not None else config.get("batches_per_epoch", 0)
    total_steps = min(cfg.max_steps or math.inf, cfg.epochs * epoch_steps or math.inf)
    known_total = int(total_steps) if total_steps != math.inf else None  # a streamed epoch of unknown length: none
    total_steps = int(total_steps) if total_steps != math.inf else 1
    # Step timing starts here, after loading the shard, so that the ETA reflects steps only.
    first_step, loop_started = pos.step, time.time()
    while pos.epoch < cfg.epochs and not done():
        if planner is not None:
            batches = planned_batches(table, planner, per_epoch, pos)
        else:
            batches = streamed_batches(cfg, shard, pos)
        for i, raw in batches:
            raw = rewrite_captions(raw, cfg, rank, pos.step)
            batch, neg, t_logits, t_pass = step_inputs(raw, meta, device, miner_cfg, generator, miner, teacher, mirrors,
                                                        teacher_route, route_mirror, teacher_cells)
            out = train_step(wrapped, objectives, optimizer, batch, neg, learning_rate(cfg, pos.step, total_steps), t_logits,
                             t_pass)
            pos.step += 1
            pos.batch_in_epoch = i + 1
            for k, v in out.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach())
            count += 1
            checkpoint_due = pos.step % cfg.checkpoint_every == 0 or done()
            if checkpoint_due or pos.step % cfg.log_every == 0:
                report(checkpoint_due)
            if done():
                break
        else:
            pos.epoch += 1
            pos.batch_in_epoch = 0
            report(True)
    if resume is not None and not last_metrics and rank == 0:
        print(f"[rank {rank}] nothing left to do at step {pos.step}", flush=True)


def rewrite_captions(raw: pa.Table, cfg: TrainJobConfig, rank: int, step: int) -> pa.Table:
    """The batch's rows with cfg.text_augment of their captions rewritten, drawn from (seed, rank, step) so that a
    resumed run rewrites each batch as the first run did."""
    if cfg.text_augment <= 0:
        return raw
    rng = np.random.default_rng((cfg.seed, rank, step))
    captions, rows = augment_batch(raw.column("caption").to_pylist(), cfg.text_augment, rng, ops=cfg.text_augment_ops)
    if not rows:
        return raw
    i = raw.schema.get_field_index("caption")
    return raw.set_column(i, raw.schema.field(i), pa.array(captions, raw.schema.field(i).type))


def step_inputs(raw: pa.Table, meta: TableMetadata, device: torch.device, miner_cfg: MinerConfig,
                generator: torch.Generator, miner: Optional[MinerNegatives] = None,
                teacher: Optional[EDJEModel] = None,
                mirrors: Optional[MirrorLookup] = None,
                route: bool = False,
                mirror_route: bool = False,
                cells: bool = False) -> Tuple[TrainBatch, Negatives, Optional[torch.Tensor], Optional[TeacherPass]]:
    """One step's inputs on the worker's device: the decoded batch (with its images' mirrored copies for the flip
    square), its hard negatives (the miner service's, or mined in the batch gathered across workers), the
    teacher's logits (distillation) and, with `route`, the teacher's route inputs on the positive pairs from the
    same teacher pass (route distillation; `mirror_route` adds them on the mirrored images), and with `cells` its
    adapter's tokens of the batch's images (cell recovery)."""
    batch = decode_batch(raw, meta)
    if mirrors is not None:
        batch.mirror_tokens, batch.has_mirror = mirrors.get(batch.image_ids)
    batch = _to_device(batch, device)
    neg = miner(batch) if miner is not None else in_batch_negatives(miner_cfg, batch, gather_batch(batch), generator)
    neg.image_tokens = neg.image_tokens.to(device)
    t_logits = t_pass = None
    if teacher is not None:
        t_logits, t_pass = teacher_scores(teacher, batch, neg, route=route, mirror=mirror_route, cells=cells)
    return batch, neg, t_logits, t_pass


def train_step(wrapped: torch.nn.Module, objectives: EDJEObjectives, optimizer: torch.optim.Optimizer,
               batch: TrainBatch, neg: Negatives, lr: float, t_logits: Optional[torch.Tensor] = None,
               t_pass: Optional[TeacherPass] = None) -> Dict[str, torch.Tensor]:
    """One optimizer step of the (DDP-wrapped) objectives at learning rate `lr`; returns the loss terms."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    out = wrapped(batch, neg, t_logits, t_pass)
    optimizer.zero_grad(set_to_none=True)
    out["loss"].backward()
    torch.nn.utils.clip_grad_norm_(objectives.parameters(), 5.0)
    optimizer.step()
    return out


def _to_device(batch: TrainBatch, device: torch.device) -> TrainBatch:
    if device.type == "cpu":
        return batch
    return TrainBatch(batch.image_ids, batch.captions, batch.tokens.to(device), batch.image_emb.to(device),
                      batch.text_emb.to(device),
                      batch.mirror_tokens.to(device) if batch.mirror_tokens is not None else None, batch.has_mirror)
