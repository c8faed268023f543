"""Tokens a text tower never trained on: their rows as they are, zeroed, or the tokens dropped, by caption template.

A backbone trained from scratch on a narrow set of captions (the sample worlds' stand-in) leaves the embedding
rows of every token its captions never use where initialisation put them: a query with such a token (a held-out
template's brackets, a word no training caption has) carries that noise into its text embedding. Three readings:

  first-stage   the first stage's text->image R@1 / R@10 of an open world's test split by caption template, the
                never-trained rows kept, zeroed, or those tokens dropped from the query
  evaluate      jobs/evaluate.py's whole evaluation with the first stage dropping those tokens (its arguments follow)
  strip         a copy of an open world's annotations and world.json with some characters removed from every
                caption (both towers then read the query without them), for jobs/evaluate.py

Which tokens were trained is read from the captions the backbone trained on (`--train-annotations`), no word list.

  python -m edje.research.unseen_tokens first-stage --train-annotations W300/flickr30k_train.json \
      --world QS/world --tokens 'QS/compressed-int8-*/tables/*.parquet' --pretrained BACKBONE.safetensors
  python -m edje.research.unseen_tokens evaluate --train-annotations W300/flickr30k_train.json -- <evaluate args>
  python -m edje.research.unseen_tokens strip --world QS/world --chars '()' --output OUT
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Dict, List, Sequence, Set

import numpy as np
import torch
import torch.nn.functional as F

MODES = ("as is", "zeroed", "dropped")


def trained_token_ids(tokenizer, captions: Sequence[str], batch: int = 4096) -> Set[int]:
    """Every token id the tokenizer gives these captions (padding included)."""
    seen: Set[int] = set()
    for i in range(0, len(captions), batch):
        seen.update(tokenizer(list(captions[i:i + batch])).flatten().tolist())
    return seen


def drop_ids(ids: torch.Tensor, keep: Set[int], pad: int = 0) -> torch.Tensor:
    """Each row with the ids outside `keep` removed, the rest moved left and padded: the same length."""
    rows = []
    for row in ids.tolist():
        kept = [x for x in row if x in keep]
        rows.append(kept + [pad] * (len(row) - len(kept)))
    return torch.tensor(rows, dtype=ids.dtype, device=ids.device)


@torch.no_grad()
def embed(clip, tokenizer, texts: Sequence[str], keep: Set[int], mode: str, batch: int = 256) -> np.ndarray:
    """Normalised text embeddings with the never-trained tokens read by `mode` (see MODES)."""
    table = clip.token_embedding.weight
    saved = table.detach().clone()
    if mode == "zeroed":
        trained = torch.zeros(len(table), dtype=torch.bool)
        trained[sorted(keep)] = True
        table[~trained] = 0
    try:
        out = []
        for i in range(0, len(texts), batch):
            ids = tokenizer(list(texts[i:i + batch]))
            if mode == "dropped":
                ids = drop_ids(ids, keep)
            out.append(F.normalize(clip.encode_text(ids).float(), dim=-1).numpy())
    finally:
        table.copy_(saved)
    return np.concatenate(out) if out else np.zeros((0, table.shape[1]), np.float32)


def test_queries(world: Path) -> List[tuple]:
    """(caption, image id, template) of the test split's first-1000 images: every held-out-template caption, and
    each image's first caption (template "first")."""
    records = {r["image_id"]: r for r in json.loads((world / "world.json").read_text())["images"]}
    out = []
    for e in json.loads((world / "flickr30k_test_first1000.json").read_text()):
        r = records[e["image_id"]]
        out += [(c, e["image_id"], t) for c, t, h in zip(r["captions"], r["caption_templates"], r["held_out_captions"]) if h]
        out.append((r["captions"][0], e["image_id"], "first"))
    return out


def recall_by_template(ranks: np.ndarray, templates: Sequence[str]) -> Dict[str, Dict[str, float]]:
    """R@1 and R@10 (%) per template, and over every held-out-template query ("held-out")."""
    templates = np.asarray(templates)
    groups = {t: templates == t for t in sorted(set(templates))}
    groups["held-out"] = templates != "first"
    return {t: {"queries": int(m.sum()), "R@1": round(100 * float((ranks[m] < 1).mean()), 1),
                "R@10": round(100 * float((ranks[m] < 10).mean()), 1)} for t, m in groups.items() if m.any()}


def first_stage(args) -> Dict[str, Dict]:
    """The first-stage reading of the module docstring, each mode's table."""
    from edje.model.backbone import VisionBackbone
    from edje.schemas.annotations import load_annotations
    from edje.schemas.config import BackboneConfig
    from edje.schemas.token_table import expand_paths
    from edje.serving.first_stage import read_image_embeddings

    backbone = VisionBackbone.create(BackboneConfig(name=args.backbone, pretrained=args.pretrained))
    keep = trained_token_ids(backbone.tokenizer, load_annotations(args.train_annotations).captions)
    ids, images, _ = read_image_embeddings(expand_paths([args.tokens]))
    row = {k: i for i, k in enumerate(ids)}
    queries = test_queries(Path(args.world))
    gold = np.array([row[i] for _, i, _ in queries])
    out = {}
    for mode in MODES:
        sims = embed(backbone.clip, backbone.tokenizer, [c for c, _, _ in queries], keep, mode) @ images.T
        ranks = (sims > sims[np.arange(len(gold)), gold][:, None]).sum(1)
        out[mode] = recall_by_template(ranks, [t for _, _, t in queries])
    return out


def evaluate(args, rest: List[str]) -> None:
    """jobs/evaluate.py with every backbone's text tower dropping the tokens its training captions never use."""
    from edje.jobs import evaluate as job
    from edje.model.backbone import VisionBackbone
    from edje.schemas.annotations import load_annotations

    captions = load_annotations(args.train_annotations).captions
    kept: Dict[int, Set[int]] = {}

    @torch.no_grad()
    def encode_text(self, texts):
        keep = kept.setdefault(id(self), trained_token_ids(self.tokenizer, captions))
        ids = drop_ids(self.tokenizer(list(texts)), keep).to(self._mean.device)
        return F.normalize(self.clip.encode_text(ids).float(), dim=-1)

    VisionBackbone.encode_text = encode_text
    job.main(rest)


def strip_world(world: Path, chars: str, output: Path) -> int:
    """Copy the annotations and world.json with `chars` removed from every caption (images linked); captions changed."""
    output.mkdir(parents=True, exist_ok=True)
    pattern = re.compile("[" + re.escape(chars) + "]")

    def clean(c: str) -> str:
        return re.sub(r"\s+", " ", pattern.sub("", c)).strip()
    changed = 0
    for path in world.glob("flickr30k_*.json"):
        entries = json.loads(path.read_text())
        for e in entries:
            caps = e["caption"] if isinstance(e["caption"], list) else [e["caption"]]
            new = [clean(c) for c in caps]
            changed += sum(a != b for a, b in zip(caps, new)) if path.name.endswith("first1000.json") else 0
            e["caption"] = new if isinstance(e["caption"], list) else new[0]
        (output / path.name).write_text(json.dumps(entries))
    records = json.loads((world / "world.json").read_text())
    for r in records["images"]:
        r["captions"] = [clean(c) for c in r["captions"]]
    (output / "world.json").write_text(json.dumps(records))
    if not (output / "images").exists():
        (output / "images").symlink_to((world / "images").resolve())
    return changed


def main(argv=None) -> None:
    """CLI entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    fs = sub.add_parser("first-stage", help="first-stage recall by caption template, per mode")
    fs.add_argument("--train-annotations", required=True, help="the captions the backbone trained on")
    fs.add_argument("--world", required=True, help="an open world's folder: world.json, flickr30k_test_first1000.json")
    fs.add_argument("--tokens", required=True, help="that test split's token tables: a file, folder or glob")
    fs.add_argument("--backbone", default="edje-tiny-convvit-128")
    fs.add_argument("--pretrained", required=True)
    ev = sub.add_parser("evaluate", help="jobs/evaluate.py, the first stage dropping never-trained tokens")
    ev.add_argument("--train-annotations", required=True)
    st = sub.add_parser("strip", help="a copy of a world's captions without some characters")
    st.add_argument("--world", required=True)
    st.add_argument("--chars", required=True)
    st.add_argument("--output", required=True)
    args, rest = p.parse_known_args(argv)
    if args.command == "evaluate":
        evaluate(args, [a for a in rest if a != "--"])
    elif args.command == "strip":
        print(f"{strip_world(Path(args.world), args.chars, Path(args.output))} test captions changed")
    else:
        if rest:
            p.error(f"unrecognised arguments: {' '.join(rest)}")
        table = first_stage(args)
        print("| template | queries | " + " | ".join(f"{m}: R@1 / R@10" for m in MODES) + " |")
        print("| --- | ---: |" + " --- |" * len(MODES))
        for t, v in table[MODES[0]].items():
            print(f"| {t} | {v['queries']} | " + " | ".join(f"{table[m][t]['R@1']} / {table[m][t]['R@10']}"
                                                           for m in MODES) + " |")


if __name__ == "__main__":
    main()
