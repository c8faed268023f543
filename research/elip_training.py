"""Training of the ELIP baseline's mapping network (research/elip_model.py) on a Karpathy-style train split.

ELIP-C's recipe at toy size: each batch is a cluster of near neighbours in the frozen backbone's
image embedding (ELIP 5.1, global hard-sample mining; training/hard_batches.py), so a sample world's
family twins land in one batch; every text of the batch re-encodes every image of the batch with its
prompts, and InfoNCE picks its own image among them. Only the mapping network trains.

Plain PyTorch, one process: the input tokens of a pool of training images are computed once (the
backbone is frozen), the per-step cost is batch_size^2 prompted transformer passes (and their
backward). The step kept is the best on the validation split's re-ranked R@1, nothing else.
"""
from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F

from edje.research.elip_eval import caption_embeddings, evaluate_reranking, first_captions, image_inputs
from edje.research.elip_model import ELIPConfig, ELIPReranker
from edje.schemas.annotations import Annotations, load_annotations
from edje.training.hard_batches import mixed_batches, neighbour_clusters


@dataclass(frozen=True)
class ELIPTrainConfig:
    """Data, batches, schedule and validation of one mapping-network run."""

    train_annotations: str
    val_annotations: str
    output: str  # folder: mapper.safetensors + elip.json (config, history, the kept step)
    elip: ELIPConfig = field(default_factory=ELIPConfig)
    # The first N training images (a sample world lists a family's images together, so families stay whole);
    # their input tokens are computed once and held in memory.
    train_images: int = 4096
    batch_size: int = 8  # images per batch = texts per batch: batch_size^2 prompted passes per step
    cluster_size: int = 8  # near neighbours per cluster; batch_size / cluster_size clusters per batch
    neighbour_fraction: float = 1.0  # share of each batch made of clusters (the rest random)
    steps: int = 600
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    logit_scale: Optional[float] = None  # InfoNCE temperature; None: the backbone's own (frozen) logit scale
    # Learn the InfoNCE scale (its log, from logit_scale) beside the mapper: one prompt set per query pulls its
    # candidates' cosines together, and a fixed scale then flattens the softmax the mapper learns from.
    learn_scale: bool = False
    eval_every: int = 200  # steps; also evaluated before the first step and after the last
    val_queries: int = 500  # first caption of the first N validation images (the gallery is the whole split)
    k: int = 10
    seed: int = 0
    threads: Optional[int] = 1

    def __post_init__(self) -> None:
        if self.batch_size < 2 or self.steps < 1 or self.eval_every < 1:
            raise ValueError("batch_size must be >= 2, steps and eval_every >= 1")
        if self.batch_size > self.train_images:
            raise ValueError(f"batch_size {self.batch_size} exceeds train_images {self.train_images}")


def infonce_loss(model: ELIPReranker, text_emb: torch.Tensor, tokens: torch.Tensor, scale,
                 image_emb: Optional[torch.Tensor] = None) -> torch.Tensor:
    """ELIP-C's loss: each text [B, e] against its prompted embeddings of all B images [B, n, d]; row i's answer is image i.
    `image_emb` [B, e]: the images' unprompted embeddings (read by a per-candidate mapper)."""
    b = len(text_emb)
    cand = None if image_emb is None else image_emb.unsqueeze(0).expand(b, *image_emb.shape)
    logits = scale * model.score(text_emb, tokens.unsqueeze(0).expand(b, *tokens.shape), cand)
    return F.cross_entropy(logits, torch.arange(b, device=logits.device))


def train_step(model: ELIPReranker, opt: torch.optim.Optimizer, text_emb: torch.Tensor, tokens: torch.Tensor,
               scale, image_emb: Optional[torch.Tensor] = None) -> float:
    """One optimiser step of the mapper on a batch (texts [B, e], their images' input tokens [B, n, d]); the loss.
    `scale`: a float, or a 0-d tensor (a learned scale, stepped by the same optimiser)."""
    loss = infonce_loss(model, text_emb, tokens, scale, image_emb)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def epoch_batches(emb: np.ndarray, cfg: ELIPTrainConfig, rng: np.random.Generator) -> list:
    """One pass over the pool in hard batches: clusters of near neighbours in the frozen image embedding."""
    clusters = neighbour_clusters(emb, cfg.cluster_size, rng) if cfg.neighbour_fraction > 0 else []
    return mixed_batches(len(emb), cfg.batch_size, cfg.neighbour_fraction, clusters, rng)


def lr_lambda(cfg: ELIPTrainConfig) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to zero over `steps`."""
    return lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / cfg.steps))


def train_elip(cfg: ELIPTrainConfig, log: Callable[[str], None] = print, model: Optional[ELIPReranker] = None) -> Dict:
    """Train the mapping network, keep the step with the best validation R@1, save it; returns the run record."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    start, load_start = time.time(), os.getloadavg()
    model = model if model is not None else ELIPReranker(cfg.elip)
    train = load_annotations(cfg.train_annotations)
    n = min(cfg.train_images, train.num_images)
    tokens, emb = image_inputs(model, train.image_paths[:n])
    token_rms = model.match_token_scale(tokens)
    per_image = train.image_to_captions()[:n]
    caption_rows = np.concatenate(per_image)
    text_emb = dict(zip(caption_rows.tolist(), caption_embeddings(model, [train.captions[j] for j in caption_rows])))
    val = first_captions(load_annotations(cfg.val_annotations), 1)
    val_tokens, val_emb = image_inputs(model, val.image_paths)
    q = min(cfg.val_queries, len(val.captions))
    val = Annotations(val.path, val.image_ids, val.image_paths, val.captions[:q], val.caption_image[:q])
    val_text = caption_embeddings(model, val.captions)
    scale = cfg.logit_scale if cfg.logit_scale is not None else float(model.backbone.clip.logit_scale.exp())
    log(f"ELIP mapper: {n} training images, {len(caption_rows)} captions, {len(val.image_ids)} val images "
        f"({q} queries); precompute {time.time() - start:.0f} s; logit scale {scale:.2f}; token RMS {token_rms:.3f}")

    def validate(step: int) -> Dict:
        m = evaluate_reranking(model, val, val_emb.numpy(), val_tokens, val_text, cfg.k)
        return {"step": step, "val_t2i": m["t2i"]["reranked"], "val_first_stage": m["t2i"]["first_stage"],
                "val_within_family": m["t2i"].get("within_family", {}).get("reranked"),
                "elapsed_s": round(time.time() - start, 1)}

    log_scale = torch.nn.Parameter(torch.tensor(math.log(scale)), requires_grad=cfg.learn_scale)
    params = list(model.mapper.parameters()) + ([log_scale] if cfg.learn_scale else [])
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    history = [validate(0)]
    log(json.dumps(history[-1]))
    best = (history[-1]["val_t2i"]["r1"], 0, copy.deepcopy(model.mapper.state_dict()))
    batches, losses, plain = [], [], []
    model.train()
    for step in range(1, cfg.steps + 1):
        if not batches:
            batches = epoch_batches(emb.numpy(), cfg, rng)
        idx = batches.pop()
        texts = torch.stack([text_emb[int(rng.choice(per_image[i]))] for i in idx])  # one caption per image
        rows = torch.from_numpy(idx)
        batch_emb = emb[rows]
        losses.append(train_step(model, opt, texts, tokens[rows], log_scale.exp(), batch_emb))
        # The same batch scored by the first stage's cosine at the same scale: what the prompts have to beat.
        plain.append(F.cross_entropy(float(log_scale.detach().exp()) * texts @ batch_emb.T,
                                     torch.arange(len(idx))).item())
        sched.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            row = {**validate(step), "loss": round(float(np.mean(losses)), 4),
                   "loss_first_stage": round(float(np.mean(plain)), 4), "logit_scale": round(float(log_scale.detach().exp()), 3)}
            history.append(row)
            log(json.dumps(row))
            losses, plain = [], []
            if row["val_t2i"]["r1"] > best[0]:  # ties keep the earlier step
                best = (row["val_t2i"]["r1"], step, copy.deepcopy(model.mapper.state_dict()))
            if step < cfg.steps:  # a run stopped early still leaves the best step so far
                save_best(model, cfg, best, history, start, load_start, q, complete=False)
            model.train()
    return save_best(model, cfg, best, history, start, load_start, q, complete=True)


def save_best(model: ELIPReranker, cfg: ELIPTrainConfig, best: tuple, history: list, start: float,
              load_start: tuple, val_queries: int, complete: bool) -> Dict:
    """Write the best step's mapper and the run record to cfg.output; the model keeps its current weights."""
    current = copy.deepcopy(model.mapper.state_dict())
    model.mapper.load_state_dict(best[2])
    record = {"train": asdict(cfg), "complete": complete, "kept_step": best[1],
              "kept_on": f"{cfg.val_annotations}: T2I R@1 re-ranked ({val_queries} queries)", "history": history,
              "wall_s": round(time.time() - start, 1), "torch_threads": torch.get_num_threads(),
              "loadavg_start": [round(x, 2) for x in load_start], "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
    model.save(cfg.output, record)
    if complete:
        model.eval()  # the returned model is the kept step
    else:
        model.mapper.load_state_dict(current)
    return record
