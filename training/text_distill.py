"""A backbone's text tower distilled into a pretrained language model's (Reimers and Gurevych, 2020: the student reads
a caption, possibly rewritten, and learns the teacher's embedding of the caption as written).

The image tower is the teacher's, bit for bit, so every table encoded with the teacher stays valid; only captions are
read (no images, no image tower pass), so a step costs the student's text forward and the backward through its
unlocked layers. What the student brings is the language model's reading of English: wordings the teacher's captions
never showed land where their meaning does. Given a storage path, a run checkpoints every few steps and a rerun
resumes where it stood, with the same batches from there on.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open

from edje.model.backbone import is_hf_text, text_embeddings_of_ids
from edje.model.backbone_registry import open_clip_registry
from edje.model.image_decode import load_image_files
from edje.model.text_augment import ALL_OPERATIONS, augment_batch, check_text_augment
from edje.schemas.annotations import load_annotations
from edje.schemas.cli_options import option
from edje.training.backbone import (
    CHECKPOINT,
    adamw_warmup_cosine,
    checkpoint_every_option,
    device_option,
    image_embeddings,
    image_size,
    load_init,
    load_training_state,
    lock_lower_text_layers,
    restore_trainer_state,
    run_folder,
    run_name_option,
    save_backbone,
    save_training_state,
    storage_path_option,
    text_embeddings,
    trainer_state,
    zero_shot_recall,
)

open_clip = open_clip_registry()


@dataclass(frozen=True)
class TextDistillConfig:
    """Whose text tower is learned, from which captions, by which student, and where its fp16 checkpoint goes."""

    teacher: str = option(required=True, help="the backbone whose text embeddings the student learns (.safetensors "
                          "written by edje train-backbone; its model is named in the file)")
    train_annotations: Tuple[str, ...] = option(flag="--train", required=True, nargs="+", convert=tuple,
                                                help="annotation JSONs whose captions are read (their images are not)")
    output: str = option(required=True, help="output .safetensors path (a .json record is written beside it)")
    model: str = option("edje-tiny-convvit-128-minilm", help="the student's open_clip model: the teacher's image tower "
                        "and a pretrained (HF) text tower")
    init: Optional[str] = option(None, help="start the student from this checkpoint of --model (a resumed run's own "
                                 "checkpoint wins)")
    eval_annotations: Optional[str] = option(None, flag="--eval", help="annotation JSON to report zero-shot recall on, "
                                             "the teacher's beside the student's")
    epochs: int = option(2, help="passes over every caption")
    batch_size: int = option(256)
    lr: float = option(2e-4)
    weight_decay: float = option(0.01)
    warmup_steps: int = option(100)
    seed: int = option(0)
    eval_every: int = option(1, help="epochs between evaluations (each also writes the output)")
    unlocked_text_layers: Optional[int] = option(None, help="train only the language model's top N layers and the "
                                                 "projection (default: all of it)")
    # Paraphrase distillation: the rewritten caption's target is the teacher's embedding of the caption as written.
    text_augment: float = option(0.0, help="share of each batch's captions the student reads rewritten (model/"
                                 "text_augment.py), against the teacher's embedding of the caption as written")
    text_augment_ops: Tuple[str, ...] = option(("function_words", "punctuate"), nargs="+",
                                               choices=list(ALL_OPERATIONS), convert=tuple,
                                               help="the rewrites --text-augment draws from (a swap can change what a "
                                               "caption says: not in the default)")
    # The cosine treats every direction alike; the first stage needs the teacher's order of images, twins included.
    image_bank: Optional[str] = option(None, help="annotation JSON whose images, embedded once by the teacher's image "
                                       "tower, make a bank: the student's softmax over it (at the teacher's "
                                       "temperature) also learns the teacher's, by KL (twins then count)")
    bank_weight: float = option(1.0, help="weight of that KL beside the cosine (with --image-bank)")
    device: Optional[str] = device_option()
    storage_path: Optional[str] = storage_path_option()
    name: Optional[str] = run_name_option()
    checkpoint_every: int = checkpoint_every_option()

    def __post_init__(self):
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        check_text_augment(self.text_augment, self.text_augment_ops)
        if self.bank_weight < 0:
            raise ValueError(f"bank_weight must be >= 0, got {self.bank_weight}")


# What a resumed run may change: where it writes and what it evaluates, never what it trains on or how.
RESUME_MAY_CHANGE = frozenset({"output", "eval_annotations", "eval_every", "device", "storage_path", "name",
                               "checkpoint_every"})


def model_in_file(path: str) -> str:
    """The open_clip model a backbone checkpoint was written for (its safetensors metadata)."""
    with safe_open(path, framework="pt") as f:
        model = (f.metadata() or {}).get("model")
    if not model:
        raise ValueError(f"{path} names no model in its metadata: not a backbone written by edje train-backbone")
    return model


def take_image_tower(student: torch.nn.Module, teacher: torch.nn.Module, student_name: str, teacher_name: str) -> None:
    """Copy the teacher's image tower into the student, frozen; ValueError when their configs name two towers (or
    two embedding widths)."""
    def tower(name: str) -> tuple:
        cfg = open_clip.get_model_config(name)
        return cfg["vision_cfg"], cfg["embed_dim"]
    if tower(student_name) != tower(teacher_name):
        raise ValueError(f"{student_name}'s image tower is not {teacher_name}'s ({tower(student_name)} against "
                         f"{tower(teacher_name)}): give a --model built on the teacher's image tower")
    theirs = teacher.visual.state_dict()
    student.visual.load_state_dict(theirs)
    student.visual.requires_grad_(False)


def length_bucketed_order(lengths: np.ndarray, batch_size: int, rng: np.random.Generator, window: int = 50) -> np.ndarray:
    """An epoch's caption order whose consecutive ``batch_size`` slices are batches of similar length: a random
    permutation, sorted by length within windows of ``window`` batches, its full batches then shuffled (a short last
    batch stays last). A batch costs its longest caption, and the loss is per caption, so the batch's mix is free."""
    order = rng.permutation(len(lengths))
    span = batch_size * window
    order = np.concatenate([w[np.argsort(lengths[w], kind="stable")] for w in np.split(order, range(span, len(order), span))])
    full = len(order) // batch_size
    batches = order[:full * batch_size].reshape(full, batch_size)[rng.permutation(full)]
    return np.concatenate([batches.reshape(-1), order[full * batch_size:]])


def distill_text_tower(cfg: TextDistillConfig, log: Callable[[str], None] = print) -> Dict:
    """Train the student's text tower on the teacher's caption embeddings (from storage_path/name's checkpoint when it
    holds one), evaluate, write `cfg.output` (fp16) and its JSON record."""
    from edje.model.device import pick_device

    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    teacher_name = model_in_file(cfg.teacher)
    teacher = open_clip.create_model(teacher_name).to(device)
    load_init(teacher, cfg.teacher, teacher_name)
    student = open_clip.create_model(cfg.model).to(device)  # initialised on the CPU: the same start on every device
    if not is_hf_text(student):
        raise ValueError(f"the student's text tower is to be a pretrained language model: {cfg.model}'s config names "
                         "no hf_model_name")
    if cfg.init:
        load_init(student, cfg.init, cfg.model)
    take_image_tower(student, teacher, cfg.model, teacher_name)
    student.logit_scale.requires_grad_(False)  # no contrastive loss here: the teacher's temperature stays
    if cfg.unlocked_text_layers is not None:
        lock_lower_text_layers(student, cfg.unlocked_text_layers)
    tokenizer = open_clip.get_tokenizer(cfg.model)
    captions = [c for path in cfg.train_annotations for c in load_annotations(path).captions]
    if not captions:
        raise ValueError(f"no captions in {', '.join(cfg.train_annotations)}")
    targets = torch.from_numpy(text_embeddings(teacher, open_clip.get_tokenizer(teacher_name), captions)).to(device)
    ids = tokenizer(captions).to(device)  # pre-tokenised once; rewritten rows again per batch
    lengths = (ids != student.text.config.pad_token_id).sum(1).cpu().numpy()
    bank = None
    if cfg.image_bank:
        paths = load_annotations(cfg.image_bank).image_paths
        pixels = torch.from_numpy(load_image_files(paths, image_size(teacher))).to(device)
        bank = torch.from_numpy(image_embeddings(teacher, pixels)).to(device)
        del pixels  # the bank keeps only the embeddings
        scale = float(teacher.logit_scale.detach().exp())
        log(f"an image bank of {len(bank)} images from {cfg.image_bank}, at the teacher's scale {scale:.1f}")
    evaluation = None
    if cfg.eval_annotations:
        ev = load_annotations(cfg.eval_annotations)
        evaluation = (ev, torch.from_numpy(load_image_files(ev.image_paths, image_size(student))).to(device))
    steps_per_epoch = math.ceil(len(captions) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    opt, sched = adamw_warmup_cosine(student, cfg.lr, cfg.weight_decay, cfg.warmup_steps, total)
    log(f"distilling {teacher_name}'s text tower into {cfg.model}'s: {len(captions)} captions, "
        f"{steps_per_epoch} steps/epoch x {cfg.epochs} epochs")
    history, step, wall_before, first_epoch, batches_done, order, losses = [], 0, 0.0, 0, 0, None, []
    teacher_recall = zero_shot_recall(teacher, open_clip.get_tokenizer(teacher_name), *evaluation) if evaluation else None
    folder = run_folder(cfg)
    resume = load_training_state(folder, cfg, RESUME_MAY_CHANGE) if folder else None
    if resume is not None:
        restore_trainer_state(resume, student, opt, sched, rng, device)  # torch's RNG: the language model's dropout
        history, step, wall_before = resume["history"], resume["step"], resume["wall_s"]
        first_epoch, batches_done, losses = resume["epoch"], resume["batch"], resume["losses"]
        order = None if resume["order"] is None else resume["order"].numpy()
        log(f"resumed from {folder / CHECKPOINT} at step {step} (epoch {first_epoch + 1}, batch {batches_done})")
    start = time.time()

    def checkpoint(epoch: int, batch: int) -> None:
        """Everything the rest of the run depends on, at `batch` batches into 0-based `epoch`."""
        save_training_state(folder, {
            "config": asdict(cfg), **trainer_state(student, opt, sched, rng, device), "epoch": epoch, "batch": batch,
            "step": step, "losses": list(losses), "history": history,
            "order": None if order is None else torch.from_numpy(order), "wall_s": wall_before + time.time() - start})

    record = None
    for epoch in range(first_epoch, cfg.epochs):
        if order is None:
            order, losses = length_bucketed_order(lengths, cfg.batch_size, rng), []
        student.train()
        report_every, epoch_start = max(1, steps_per_epoch // 10), time.time()
        for b in range(batches_done, steps_per_epoch):
            idx = order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            batch_ids = ids[torch.from_numpy(idx).to(device)]
            if cfg.text_augment > 0:
                rewritten, rows = augment_batch([captions[i] for i in idx], cfg.text_augment, rng,
                                                ops=cfg.text_augment_ops)
                if rows:
                    batch_ids[rows] = tokenizer([rewritten[r] for r in rows]).to(device)
            # 1 - cosine to the teacher's unit embedding: what the first stage's ranking reads.
            own = text_embeddings_of_ids(student, batch_ids)
            loss = (1 - (own * targets[idx]).sum(-1)).mean()
            if bank is not None:
                teacher_order = F.softmax(scale * targets[idx] @ bank.T, dim=-1)
                loss = loss + cfg.bank_weight * F.kl_div(F.log_softmax(scale * own @ bank.T, dim=-1), teacher_order,
                                                         reduction="batchmean")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            step += 1
            if folder and step % cfg.checkpoint_every == 0 and b + 1 < steps_per_epoch:
                checkpoint(epoch, b + 1)
            if (b + 1) % report_every == 0 and b + 1 < steps_per_epoch:
                spent = time.time() - epoch_start
                done_here = b + 1 - batches_done
                log(f"epoch {epoch + 1}/{cfg.epochs} batch {b + 1}/{steps_per_epoch}: running loss "
                    f"{np.mean(losses):.4f}, {done_here * cfg.batch_size / max(spent, 1e-9):.0f} captions/s, "
                    f"epoch eta {spent / done_here * (steps_per_epoch - b - 1):.0f} s")
        row = {"epoch": epoch + 1, "step": step, "loss": round(float(np.mean(losses)), 5),
               "elapsed_s": round(wall_before + time.time() - start, 1)}
        if evaluation and ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs):
            row["recall"] = zero_shot_recall(student, tokenizer, *evaluation)
            row["teacher_recall"] = teacher_recall
        history.append(row)
        log(json.dumps(row))
        order, batches_done = None, 0
        if folder:
            checkpoint(epoch + 1, 0)
        if "recall" in row or epoch + 1 == cfg.epochs:  # a usable checkpoint early; the last overwrites it
            record = save_backbone(student, cfg, history, wall_before + time.time() - start,
                                   done=epoch + 1 == cfg.epochs)
    if record is None:  # resumed after its last epoch: the weights are the checkpoint's
        record = save_backbone(student, cfg, history, wall_before, done=True)
    return record
