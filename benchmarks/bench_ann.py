"""Approximate first stage (IVF-PQ) against exact search on a large sample world, before and after reranking.

    .venv/bin/python benchmarks/bench_ann.py --images 20000 --val-seed 8181 --seed 8282 --queries 1000 \
        --factories IVF256,PQ16 IVF256,PQ32 IVF512,PQ32 --nprobes 8 16 32 --json runs/bench_ann.json

Two worlds that no other run used: on the validation world every (factory, nprobe) is built and its recall@10
against exact search is measured with caption queries; the one with the best recall per byte that reaches
--min-recall is kept. On the test world, Flat and the kept index each serve as the first stage of the shipped
reranker (int8 stored rows, the checkpoint's ranking rule with the exact cosine of the stored embedding): printed
are first-stage recall@10 against Flat, first-stage and reranked text->image R@1, the index's bytes (one shard
holds all rows here) and the build time.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def encode_world(reranker, seed: int, images: int, workdir: Path):
    """A test-only world of `images` images, encoded as the encode job would store them; (annotations, rows)."""
    from edje.sampleworld.world import WorldConfig, generate
    from edje.schemas.annotations import load_annotations

    world = workdir / f"world-{seed}"
    if not (world / "world.json").exists():
        generate(WorldConfig(seed=seed, n_train=0, n_val=0, n_test=images), world)
    ann = load_annotations(str(world / "flickr30k_test.json"))
    cache = workdir / f"rows-{seed}.npz"
    if cache.exists():
        z = np.load(cache)
        from edje.model.token_encoder import EncodedImages
        return ann, EncodedImages(z["blob"], z["scales"] if z["scales"].size else None, z["embeddings"])
    t0 = time.time()
    rows = reranker.encode_images(list(ann.image_paths), batch_size=128)
    np.savez(cache, blob=rows.blob, scales=rows.scales if rows.scales is not None else np.zeros(0), embeddings=rows.embeddings)
    print(f"[ann] world {seed}: {ann.num_images} images encoded in {time.time() - t0:.0f} s", flush=True)
    return ann, rows


def caption_queries(reranker, ann, n: int, seed: int):
    """n images drawn with a fixed seed, one caption each: (texts, text embeddings, answer rows)."""
    pick = np.sort(np.random.default_rng(seed).choice(ann.num_images, min(n, ann.num_images), replace=False))
    caps = ann.image_to_captions()
    texts = [ann.captions[caps[i][0]] for i in pick]
    return texts, reranker.encoder.encode_text(texts), pick


def first_stage(index, queries: np.ndarray, k: int) -> np.ndarray:
    """Top-k rows per query."""
    return index.search(queries, k)[1]


def rerank_r1(reranker, rows, texts, qemb, hits: np.ndarray, answers: np.ndarray) -> float:
    """Text->image R@1 after the checkpoint's ranking rule over each query's hits (int8 stored rows)."""
    meta = reranker._meta()
    k = hits.shape[1]
    flat = np.where(hits < 0, 0, hits).reshape(-1)
    pair_texts = [t for t in texts for _ in range(k)]
    logits = reranker.scorer.blob_logits(meta, pair_texts, rows.blob[flat], None if rows.scales is None else rows.scales[flat])
    cos = np.einsum("qd,qkd->qk", qemb, rows.embeddings[hits.clip(0)]).reshape(-1)
    scores = reranker.scorer.scores(logits, cos).reshape(len(texts), k)
    scores = np.where(hits < 0, -np.inf, scores)
    best = hits[np.arange(len(texts)), scores.argmax(1)]
    return float(np.mean(best == answers) * 100)


def main() -> int:
    """Select the approximate index on the validation world, compare it with Flat on the test world."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=20000)
    p.add_argument("--val-seed", type=int, default=8181)
    p.add_argument("--seed", type=int, default=8282)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--k", type=int, default=10, help="candidates the reranker sees")
    p.add_argument("--factories", nargs="+", default=["IVF256,PQ16", "IVF256,PQ32", "IVF512,PQ32"])
    p.add_argument("--nprobes", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--min-recall", type=float, default=0.9, help="recall@10 the kept index must reach on val")
    p.add_argument("--checkpoint", default=None, help="reranker (default: the shipped one)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()

    import faiss
    import torch

    from edje import EDJEReranker
    from edje.schemas.shipped import DEFAULT_RERANKER
    from edje.storage.embedding_index import EmbeddingIndex

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)  # on a shared machine, spinning OpenMP threads cost more than they give
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-ann-"))
    workdir.mkdir(parents=True, exist_ok=True)
    reranker = EDJEReranker.from_pretrained(args.checkpoint or DEFAULT_RERANKER)
    ids = [str(i) for i in range(args.images)]

    # Selection on the validation world: recall@10 against exact search, with caption queries.
    ann, rows = encode_world(reranker, args.val_seed, args.images, workdir)
    _, qemb, _ = caption_queries(reranker, ann, args.queries, seed=1)
    sweep = []
    for factory in args.factories:
        index = EmbeddingIndex(ids, rows.embeddings, factory)
        for nprobe in args.nprobes:
            index.index.nprobe = nprobe
            sweep.append({"factory": factory, "nprobe": nprobe, "recall_at_10": round(index.recall_vs_exact(10, qemb), 4),
                          "index_bytes": index.nbytes()})
            print(f"[ann] val {factory} nprobe={nprobe}: recall@10 {sweep[-1]['recall_at_10']:.3f}, "
                  f"{sweep[-1]['index_bytes']:,} B", flush=True)
    good = [s for s in sweep if s["recall_at_10"] >= args.min_recall] or sorted(sweep, key=lambda s: -s["recall_at_10"])[:1]
    chosen = min(good, key=lambda s: (s["index_bytes"], s["nprobe"]))
    print(f"[ann] kept on val: {chosen}", flush=True)

    # The test world: Flat and the kept index as the reranker's first stage.
    ann, rows = encode_world(reranker, args.seed, args.images, workdir)
    texts, qemb, answers = caption_queries(reranker, ann, args.queries, seed=2)
    load = os.getloadavg()[0]
    out = {"images": args.images, "queries": len(texts), "k": args.k, "val_seed": args.val_seed, "seed": args.seed,
           "sweep_val": sweep, "chosen": chosen, "rows": []}
    flat_hits = None
    for factory, params in (("Flat", ""), (chosen["factory"], f"nprobe={chosen['nprobe']}")):
        t0 = time.time()
        index = EmbeddingIndex(ids, rows.embeddings, factory, search_params=params)
        build_s = time.time() - t0
        t0 = time.time()
        hits = first_stage(index, qemb, args.k)
        search_ms = (time.time() - t0) / len(texts) * 1000
        flat_hits = hits if flat_hits is None else flat_hits
        recall = float(np.mean([len(set(a) & set(b)) / args.k for a, b in zip(hits.tolist(), flat_hits.tolist())]))
        row = {"index": f"{factory} {params}".strip(), "index_bytes": index.nbytes(),
               "vectors_kept_bytes": 0 if index.copy is None else int(index.copy.nbytes),
               "build_s": round(build_s, 2), "search_ms_per_query": round(search_ms, 3),
               "recall_at_10_vs_flat": round(recall, 4),
               "first_stage_r1": round(float(np.mean(hits[:, 0] == answers) * 100), 2),
               "first_stage_r10": round(float(np.mean((hits == answers[:, None]).any(1)) * 100), 2),
               "reranked_r1": round(rerank_r1(reranker, rows, texts, qemb, hits, answers), 2)}
        out["rows"].append(row)
        print(f"[ann] test {row}", flush=True)
    out["load_average"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    flat, ann_row = out["rows"]
    print(f"\n[ann] {args.images:,} images (world {args.seed}), {len(texts)} caption queries, top {args.k} reranked "
          f"by the shipped reranker (int8); load {out['load_average']}")
    print(f"[ann] {'index':24s} {'bytes':>12s} {'recall@10 vs flat':>18s} {'first-stage R@1':>16s} {'R@10':>6s} "
          f"{'reranked R@1':>13s} {'build s':>8s}")
    for r in out["rows"]:
        print(f"[ann] {r['index']:24s} {r['index_bytes']:12,d} {r['recall_at_10_vs_flat']:18.3f} {r['first_stage_r1']:16.1f} "
              f"{r['first_stage_r10']:6.1f} {r['reranked_r1']:13.1f} {r['build_s']:8.2f}")
    print(f"[ann] reranked R@1 difference (IVF-PQ - flat): {ann_row['reranked_r1'] - flat['reranked_r1']:+.1f} "
          f"(goal: within 1 point); index {flat['index_bytes'] / ann_row['index_bytes']:.1f}x smaller")
    if args.json:
        from edje.pipeline.storage import write_json

        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
