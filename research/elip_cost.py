"""Re-ranking cost side by side: ELIP (k prompted backbone passes per query) vs EDJE (k joint-encoder pairs).

Both score the same (query, candidate) pairs of a split's first-stage top k in one process, alternating,
on the same threads, so a busy machine slows both alike; prints pairs/s each, the ratio and the load.

  python research/elip_cost.py --elip runs/elip --edje checkpoints/edje-local-bind \
      --annotations runs/quickstart57/world/flickr30k_test.json --tokens runs/quickstart57/compressed-int8/tables
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch


def main(argv=None) -> None:
    """Time both rerankers over the same pairs and print one JSON line."""
    from edje.evaluation.rerank_eval import first_stage, score_pairs, select_rows
    from edje.model.scoring import PairScorer
    from edje.research.elip_eval import caption_embeddings, first_captions, image_inputs, rerank_scores, table_embeddings
    from edje.research.elip_model import load_elip
    from edje.schemas.annotations import load_annotations
    from edje.schemas.token_table import decode_tokens, expand_paths, read_token_tables

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--elip", required=True)
    p.add_argument("--edje", required=True, help="EDJE checkpoint matching the (compressed) tables")
    p.add_argument("--annotations", required=True)
    p.add_argument("--tokens", nargs="+", required=True, help="compressed token tables (EDJE's input, first stage)")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    elip = load_elip(a.elip)
    ann = first_captions(load_annotations(a.annotations), 1)
    tokens, _ = image_inputs(elip, ann.image_paths)
    text = caption_embeddings(elip, ann.captions[:a.queries])
    _, top = first_stage(text.numpy(), table_embeddings(ann, a.tokens, elip), a.k)
    table, meta = read_token_tables(expand_paths(a.tokens))
    table = table.take(select_rows(ann, table.column("image_id").to_pylist()))
    if meta.kind != "compressed":
        raise ValueError("give compressed tables: EDJE reads their tokens as stored")
    edje = PairScorer.from_checkpoint(a.edje, device="cpu", batch_size=128)  # evaluation's scoring path, fp32
    edje_images = torch.from_numpy(decode_tokens(table, meta))
    texts = [ann.captions[q] for q in np.repeat(np.arange(a.queries), a.k)]
    pairs = a.queries * a.k
    rates = {"elip": [], "edje": []}
    for _ in range(a.rounds):
        t = time.perf_counter()
        score_pairs(edje, texts, top.reshape(-1), edje_images)
        rates["edje"].append(pairs / (time.perf_counter() - t))
        _, seconds = rerank_scores(elip, text, top, tokens)
        rates["elip"].append(pairs / seconds)
    med = {k: round(float(np.median(v)), 1) for k, v in rates.items()}
    print(json.dumps({"pairs_per_s": med, "edje_over_elip": round(med["edje"] / med["elip"], 2), "pairs": pairs,
                      "rounds": a.rounds, "torch_threads": torch.get_num_threads(),
                      "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
