"""A first stage whose text side has read English: what the open world's held-out templates cost the stand-in. A study.

The stand-in backbone's text tower learned English from the sample world's captions alone, so it misreads wordings
none of them shows (the terse held-out templates: attributes after the noun, in brackets), and the shipped rule
fuses that misreading into the ranking. A user's pretrained text tower has read such forms. This trains a small
head on the frozen token states of a pretrained language model (the packaged all-MiniLM-L6-v2, or `--language-model`)
against the backbone's locked image embeddings (LiT: contrastive, the image side fixed) on a training split's
captions, then reads its cosine in the shipped pair's fusion, ITM + w x ((1 - a) x the backbone's cosine + a x the
head's), `a` and `w` fitted on a validation split by T2I R@1, over the shipped first stage's top k (the same
candidates: a paired reading). Figures as research/confidence_fusion.py gives them, and each first stage alone.

  python -m edje.research.pretrained_text_first_stage --checkpoint CK --backbone-pretrained BB \\
      --train-annotations W300/flickr30k_train.json --train-tokens r300/train_images.parquet \\
      --fit-annotations W300/flickr30k_val.json --fit-tokens r300/val.parquet \\
      --annotations QS/world/flickr30k_test_first1000.json --tokens 'QS/compressed-int8-*/tables' --output OUT
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edje.evaluation.eval_config import EvalConfig
from edje.research.confidence_fusion import Capture, cached_capture, fit_global, report

# The share of the head's cosine in the mixed first-stage term, tried on the fit split.
MIX = (0.0, 0.25, 0.5, 0.75, 1.0)


def caption_states(texts: Sequence[str], folder: str, max_length: int = 64,
                   batch: int = 256) -> Tuple[np.ndarray, np.ndarray]:
    """The language model's last-layer token states [N, max_length, H] (float16) and their mask [N, max_length]."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    states = np.zeros((len(texts), max_length, model.config.hidden_size), np.float16)
    mask = np.zeros((len(texts), max_length), bool)
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            # Padded to the batch's longest caption, not to max_length: the model's cost follows the length.
            b = tok(list(texts[i:i + batch]), padding=True, truncation=True, max_length=max_length,
                    return_tensors="pt")
            n = b["input_ids"].shape[1]
            states[i:i + batch, :n] = model(**b).last_hidden_state.numpy().astype(np.float16)
            mask[i:i + batch, :n] = b["attention_mask"].numpy().astype(bool)
    return states, mask


class TextHead(nn.Module):
    """Frozen token states to a unit embedding: an attention pool and the masked mean, then an MLP."""

    def __init__(self, width: int, embed_dim: int, hidden: int = 512, dropout: float = 0.0) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.randn(width) / width ** 0.5)
        self.mlp = nn.Sequential(nn.LayerNorm(2 * width), nn.Dropout(dropout), nn.Linear(2 * width, hidden), nn.GELU(),
                                 nn.Dropout(dropout), nn.Linear(hidden, embed_dim))
        self.logit_scale = nn.Parameter(torch.tensor(float(np.log(1 / 0.07))))

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, L, H] states, [B, L] mask -> [B, e] unit embeddings."""
        scores = (states @ self.query) / states.shape[-1] ** 0.5
        attn = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=1)
        pooled = (attn.unsqueeze(-1) * states).sum(1)
        mean = (states * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return F.normalize(self.mlp(torch.cat([pooled, mean], dim=-1)), dim=-1)


def embed(head: TextHead, states: np.ndarray, mask: np.ndarray, batch: int = 1024) -> np.ndarray:
    """The head's unit embeddings [N, e] of these states."""
    head.eval()
    with torch.no_grad():
        out = [head(torch.from_numpy(states[i:i + batch]).float(), torch.from_numpy(mask[i:i + batch]))
               for i in range(0, len(states), batch)]
    return torch.cat(out).numpy()


def train_head(states: np.ndarray, mask: np.ndarray, caption_image: np.ndarray, images: np.ndarray, epochs: int,
               batch: int = 256, lr: float = 1e-3, seed: int = 0, log=print, dropout: float = 0.0,
               validate: Optional[Callable[[TextHead], float]] = None) -> TextHead:
    """LiT on locked image embeddings: each epoch takes one random caption of every image, in batches of distinct
    images, and pulls it to its image against the batch's others, both ways. With `validate` (a score of the head,
    higher better) the epoch that scores best is the one returned."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    head = TextHead(states.shape[-1], images.shape[1], dropout=dropout)
    best = (-np.inf, None, 0)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    by_image = [np.flatnonzero(caption_image == i) for i in range(len(images))]
    with_caption = np.array([i for i, c in enumerate(by_image) if len(c)])
    steps = epochs * -(-len(with_caption) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    image_t = torch.from_numpy(images).float()
    for epoch in range(epochs):
        head.train()
        order = rng.permutation(with_caption)
        losses = []
        for i in range(0, len(order), batch):
            imgs = order[i:i + batch]
            caps = np.array([rng.choice(by_image[j]) for j in imgs])
            text = head(torch.from_numpy(states[caps]).float(), torch.from_numpy(mask[caps]))
            logits = head.logit_scale.exp().clamp(max=100) * text @ image_t[imgs].T
            target = torch.arange(len(imgs))
            loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
        score = None if validate is None else validate(head)
        log(f"epoch {epoch + 1}/{epochs}: contrastive loss {np.mean(losses):.3f}"
            + ("" if score is None else f", validation {score:.2f}"))
        if score is not None and score > best[0]:
            best = (score, copy.deepcopy(head.state_dict()), epoch + 1)
    if best[1] is not None:
        head.load_state_dict(best[1])
        log(f"kept epoch {best[2]} (validation {best[0]:.2f})")
    return head


def gallery_r1(head: TextHead, states: np.ndarray, mask: np.ndarray, c: Capture) -> float:
    """The head's T2I R@1 (%) over a capture's whole gallery (its own first stage, no reranker)."""
    top = np.argmax(embed(head, states, mask) @ c.images.T, axis=1)
    return 100.0 * float(np.mean([t in a for t, a in zip(top, c.answers)]))


def mixed(c: Capture, text: np.ndarray, a: float) -> Capture:
    """The capture with its first-stage cosine over the same candidates made (1 - a) x its own + a x the head's."""
    head_sim = np.einsum("qe,qke->qk", text, c.images[c.idx[:, :c.sim.shape[1]]])
    return dataclasses.replace(c, sim=((1 - a) * c.sim + a * head_sim).astype(np.float32))


def first_stage_alone(c: Capture) -> Dict:
    """The capture's first stage (its cosine alone) over its top k: every query, training and held-out templates."""
    alone = dataclasses.replace(c, itm=np.zeros_like(c.itm))
    return report(alone, {"feature": None, "w_lo": 1.0, "w_hi": 1.0, "threshold": 0.0, "fit_r1": None})


def shipped_rule(checkpoint: str) -> Dict:
    """The checkpoint's own ranking rule as this study's rule dict (its switch on the top cosine, if it has one)."""
    from edje.model.ranking import read_ranking

    r = read_ranking(checkpoint)
    low = r.first_stage_weight if r.low_confidence_weight is None else r.low_confidence_weight
    return {"feature": "top", "w_lo": low, "w_hi": r.first_stage_weight,
            "threshold": float(r.confidence_threshold or 0.0), "fit_r1": None}


def study(fit: Capture, test: Capture, fit_text: np.ndarray, test_text: np.ndarray,
          checkpoint: Optional[str] = None) -> Dict[str, Dict]:
    """The checkpoint's own rule, then per mix share: the weight fitted on `fit`, its fit R@1, and the test figures;
    each with the first stage alone."""
    rows = {}
    if checkpoint is not None:
        rows["shipped rule"] = {**report(test, shipped_rule(checkpoint)), "first_stage": first_stage_alone(test)}
    for a in MIX:
        rule = fit_global(mixed(fit, fit_text, a))
        test_a = mixed(test, test_text, a)
        rows[f"mix {a:g}"] = {**report(test_a, rule), "first_stage": first_stage_alone(test_a)}
    best = max(MIX, key=lambda a: (rows[f"mix {a:g}"]["rule"]["fit_r1"], -a))
    rows["chosen on the fit split"] = {"mix": best, **rows[f"mix {best:g}"]}
    return rows


def image_rows(annotations: str, table_paths: Sequence[str]) -> Tuple[List[str], np.ndarray, np.ndarray]:
    """A training split's captions, each caption's row in the image embeddings, and those embeddings."""
    from edje.schemas.annotations import load_annotations
    from edje.serving.first_stage import read_image_embeddings

    ids, emb, _ = read_image_embeddings(list(table_paths))
    row = {k: i for i, k in enumerate(ids)}
    ann = load_annotations(annotations)
    return ann.captions, np.array([row[ann.image_ids[i]] for i in ann.caption_image]), emb


def cached_states(path: Path, texts: Sequence[str], folder: str, max_length: int) -> Tuple[np.ndarray, np.ndarray]:
    """`caption_states`, kept in `path` (.npz) so that a rerun reads them."""
    if path.exists():
        z = np.load(path)
        return z["states"], z["mask"]
    states, mask = caption_states(texts, folder, max_length)
    np.savez(path, states=states, mask=mask)
    return states, mask


def main(argv=None) -> None:
    """CLI entry point (see the module docstring)."""
    from edje.schemas.token_table import expand_paths
    from edje.training.language_model import resolve_language_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--backbone-pretrained", default=None)
    p.add_argument("--train-annotations", nargs="+", required=True, help="the captions the head trains on")
    p.add_argument("--train-tokens", nargs="+", required=True,
                   help="token tables of those images (image rows), one table or folder per annotation file")
    p.add_argument("--fit-annotations", required=True)
    p.add_argument("--fit-tokens", nargs="+", required=True)
    p.add_argument("--annotations", required=True)
    p.add_argument("--tokens", nargs="+", required=True)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--language-model", default=None, help="a folder or hub id (default: the packaged MiniLM)")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--select-on-fit", action="store_true",
                   help="keep the epoch whose head alone ranks the fit split's gallery best (T2I R@1)")
    p.add_argument("--output", required=True)
    a = p.parse_args(argv)
    if len(a.train_tokens) != len(a.train_annotations):
        p.error("--train-tokens takes one table or folder per --train-annotations file")
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    folder = resolve_language_model(a.language_model).folder
    common = dict(checkpoint=a.checkpoint, backbone_pretrained=a.backbone_pretrained, k=a.k, output="")
    test = cached_capture(out / "test.pkl", EvalConfig(annotations=a.annotations, tokens=a.tokens,
                                                       max_queries_per_image=1, held_out_template_queries=1, **common))
    fit = cached_capture(out / "fit.pkl", EvalConfig(annotations=a.fit_annotations, tokens=a.fit_tokens, **common))
    t0 = time.time()
    parts = []
    for i, (ann, tables) in enumerate(zip(a.train_annotations, a.train_tokens)):
        texts, caption_image, images = image_rows(ann, expand_paths([tables]))
        name = "train_states.npz" if i == 0 else f"train_states_{i}.npz"
        parts.append((*cached_states(out / name, texts, folder, a.max_length), caption_image, images))
    offsets = np.cumsum([0] + [len(x[3]) for x in parts[:-1]])
    states = np.concatenate([x[0] for x in parts])
    mask = np.concatenate([x[1] for x in parts])
    caption_image = np.concatenate([x[2] + o for x, o in zip(parts, offsets)])
    images = np.concatenate([x[3] for x in parts])
    del parts
    print(f"train states {states.shape} of {len(images)} images in {time.time() - t0:.0f} s", flush=True)
    fit_states = cached_states(out / "fit_states.npz", fit.texts, folder, a.max_length)
    head_path = out / "head.pt"
    if head_path.exists():
        head = TextHead(states.shape[-1], images.shape[1], dropout=a.dropout)
        head.load_state_dict(torch.load(head_path))
    else:
        t0 = time.time()
        head = train_head(states, mask, caption_image, images, a.epochs, a.batch_size, a.lr, a.seed,
                          log=lambda s: print(s, flush=True), dropout=a.dropout,
                          validate=(lambda h: gallery_r1(h, *fit_states, fit)) if a.select_on_fit else None)
        torch.save(head.state_dict(), head_path)
        print(f"head trained in {time.time() - t0:.0f} s", flush=True)
    print(f"the head alone: fit split T2I R@1 {gallery_r1(head, *fit_states, fit):.2f} over its whole gallery",
          flush=True)
    fit_text = embed(head, *fit_states)
    test_text = embed(head, *cached_states(out / "test_states.npz", test.texts, folder, a.max_length))
    rows = study(fit, test, fit_text, test_text, a.checkpoint)
    (out / "pretrained_text_first_stage.json").write_text(json.dumps(rows, indent=2) + "\n")
    for name, r in rows.items():
        cells = [f"{part} R@1 {r[part]['r1']:.1f} wf {r[part].get('within_family')}"
                 for part in ("all", "training_templates", "held_out_templates") if part in r]
        alone = r["first_stage"]
        print(f"{name}: {r['rule']} | " + " | ".join(cells)
              + f" | first stage alone: all {alone['all']['r1']:.1f} / {alone['all'].get('within_family')}, held-out "
              + f"{alone.get('held_out_templates', {}).get('r1')} / "
              + f"{alone.get('held_out_templates', {}).get('within_family')}", flush=True)


if __name__ == "__main__":
    main()
