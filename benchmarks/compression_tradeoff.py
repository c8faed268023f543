"""Storage against quality and speed: EDJE local and compressed rerankers, each stored as fp16, int8 and int4.

On one sample world (use a seed no run used), for every (checkpoint, codec) row: bytes per image,
T2I and I2T R@1 before and after reranking, within-family accuracy overall and per twin kind
(jobs/evaluate.py's figures: raw backbone tables, the adapter's output round-tripped through the
codec), the joint encoder's input length, and pairs/s measured side by side in one process
(rounds A B C A B C ..., the same texts, each model on its own stored tokens; median per model).
Writes results.json and results.md in the workdir and the plot of R@1 against bytes per image.

  python benchmarks/compression_tradeoff.py --seed 5151 --workdir runs/tradeoff \
      --model local=checkpoints/edje-local-bind --model c16=runs/comp/c16d/model --output docs/recall_vs_bytes.png
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import numpy as np  # noqa: E402
import torch  # noqa: E402

from edje.sampleworld.registry import world_kind  # noqa: E402
from edje.schemas.codecs import bytes_per_image  # noqa: E402

KINDS = world_kind("shapes").twin_kinds  # the trade-off is measured on a shapes world


def prepare(workdir: Path, seed: int, n_test: int, pretrained: str) -> tuple:
    """The world's test split and its raw backbone table (made once)."""
    from edje.evaluation.tables import encode_annotations
    from edje.model.backbone import VisionBackbone
    from edje.sampleworld.world import WorldConfig, generate
    from edje.schemas.config import BackboneConfig

    world = workdir / "world"
    ann, raw = world / "flickr30k_test.json", workdir / "raw.parquet"
    if not ann.exists():
        generate(WorldConfig(seed=seed, n_train=0, n_val=0, n_test=n_test), world)
    if not raw.exists():
        encode_annotations(str(ann), VisionBackbone.create(BackboneConfig("edje-tiny-convvit", pretrained)), str(raw))
    return ann, raw


def evaluate_row(workdir: Path, name: str, checkpoint: str, codec: str, ann: Path, raw: Path, k: int) -> dict:
    """jobs/evaluate.py's metrics of one checkpoint with its adapter's output stored as `codec` (cached)."""
    from edje.evaluation.rerank_eval import EvalConfig, evaluate

    out = workdir / "eval" / f"{name}_{codec}"
    if (out / "metrics.json").exists():
        return json.loads((out / "metrics.json").read_text())
    return evaluate(EvalConfig(annotations=str(ann), tokens=[str(raw)], output=str(out), checkpoint=checkpoint, k=k,
                               max_queries_per_image=1, quant=codec, examples=1))


def pairs_per_second(models: dict, raw: Path, pairs: int, rounds: int) -> dict:
    """Median pairs/s of each model's joint encoder over the same texts, timed in interleaved rounds."""
    from edje.model.scoring import PairScorer
    from edje.schemas.token_table import decode_tokens, read_token_table

    table, meta = read_token_table(str(raw))
    tokens = torch.from_numpy(decode_tokens(table, meta))
    texts = table.column("caption").to_pylist()
    idx = np.arange(pairs) % len(texts)
    batch = [texts[i] for i in idx]
    scorers, stored = {}, {}
    for name, ck in models.items():
        scorers[name] = PairScorer.from_checkpoint(ck, "cpu", "fp32", batch_size=256)
        stored[name] = scorers[name].encoder_tokens(meta, tokens)
        scorers[name].itm_logits(batch[:256], stored[name], idx[:256])  # warm-up
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, s in scorers.items():
            t = time.perf_counter()
            s.itm_logits(batch, stored[name], idx)
            times[name].append(time.perf_counter() - t)
    return {name: pairs / statistics.median(ts) for name, ts in times.items()}


def summarise(name: str, checkpoint: str, codec: str, m: dict, pps: float, base_pps: float) -> dict:
    """One table row."""
    cfg = json.loads((Path(checkpoint) / "config.json").read_text())["config"]
    tokens, width = cfg["encoder"]["num_image_tokens"], cfg["adapter"]["output_dim"]
    row = {"model": name, "codec": codec, "tokens": tokens, "width": width,
           "bytes_per_image": bytes_per_image(tokens, width, codec),
           "input_length": cfg["encoder"]["max_text_tokens"] + 3 + tokens,
           "pairs_per_s": round(pps, 1), "pairs_per_s_vs_first": round(pps / base_pps, 2)}
    for d in ("t2i", "i2t"):
        row[f"{d}_first_r1"] = m[d]["first_stage"]["r1"]
        row[f"{d}_r1"] = m[d]["reranked"]["r1"]
        fam = m[d].get("within_family", {})
        row[f"{d}_within_family"] = fam.get("reranked", {}).get("accuracy")
    kinds = m["t2i"].get("within_family", {}).get("by_kind", {}).get("reranked", {})
    row.update({f"t2i_{k}": kinds.get(k, {}).get("accuracy") for k in KINDS})
    return row


def markdown(rows: list) -> str:
    """The results as a Markdown table."""
    head = ("| model | codec | B/image | input length | T2I R@1 (first -> reranked) | I2T R@1 | within-family T2I / I2T "
            "| T2I twins colour / shape / size / relation | pairs/s (x first row) |")
    lines = [head, "| --- | --- | ---: | ---: | --- | --- | --- | --- | ---: |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['codec']} | {r['bytes_per_image']:,} | {r['input_length']} | "
                     f"{r['t2i_first_r1']} -> **{r['t2i_r1']}** | {r['i2t_first_r1']} -> {r['i2t_r1']} | "
                     f"{r['t2i_within_family']} / {r['i2t_within_family']} | "
                     + " / ".join(str(r[f't2i_{k}']) for k in KINDS)
                     + f" | {r['pairs_per_s']:,} ({r['pairs_per_s_vs_first']}x) |")
    return "\n".join(lines)


def plot(rows: list, output: str, title: str) -> None:
    """R@1 (T2I and I2T, after reranking) against bytes per image, one marker per model, the first stage as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for d, marker in (("t2i", "o"), ("i2t", "s")):
        for model in dict.fromkeys(r["model"] for r in rows):
            pts = sorted((r["bytes_per_image"], r[f"{d}_r1"], r["codec"]) for r in rows if r["model"] == model)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=f"{model} {d.upper()}")
            for x, y, c in pts:
                ax.annotate(c, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.axhline(rows[0][f"{d}_first_r1"], ls="--", lw=0.8, color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("stored bytes per image (tokens x width x codec)")
    ax.set_ylabel("R@1 after reranking (dashed: first stage)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(output, dpi=120)


def main(argv=None) -> dict:
    """CLI entry point; returns the rows."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, required=True, help="world seed no training or selection run used")
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument("--workdir", default="runs/tradeoff")
    p.add_argument("--model", action="append", required=True, metavar="NAME=CHECKPOINT")
    p.add_argument("--codecs", nargs="+", default=["fp16", "int8", "int4"])
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--pairs", type=int, default=1024, help="pairs per timed call")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--pretrained", default=str(ROOT / "checkpoints" / "edje-tiny-convvit-sw.safetensors"))
    p.add_argument("--output", help="plot path (e.g. docs/recall_vs_bytes.png)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    models = dict(spec.split("=", 1) for spec in a.model)
    ann, raw = prepare(work, a.seed, a.n_test, a.pretrained)
    metrics = {(n, c): evaluate_row(work, n, ck, c, ann, raw, a.k) for n, ck in models.items() for c in a.codecs}
    load = os.getloadavg()
    pps = pairs_per_second(models, raw, a.pairs, a.rounds)
    first = next(iter(models))
    rows = [summarise(n, ck, c, metrics[(n, c)], pps[n], pps[first]) for n, ck in models.items() for c in a.codecs]
    table = markdown(rows)
    note = (f"world seed {a.seed}, {a.n_test} test images, 1 caption per image, k={a.k}; pairs/s: {a.threads} torch "
            f"thread(s), {a.pairs} pairs x {a.rounds} interleaved rounds, load average {load[0]:.2f} {load[1]:.2f}")
    print(table + "\n\n" + note)
    (work / "results.json").write_text(json.dumps({"rows": rows, "note": note}, indent=2))
    (work / "results.md").write_text(table + "\n\n" + note + "\n")
    if a.output:
        plot(rows, a.output, f"EDJE rerankers on sample world seed {a.seed}: R@1 against stored bytes")
    return {"rows": rows, "note": note}


if __name__ == "__main__":
    main()
