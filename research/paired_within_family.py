"""Two pairs' within-family accuracy on the same queries and the same twins: a paired reading of a change.

jobs/evaluate.py's within-family figure counts a query only where its answer and one of its twins are both in the
first stage's top k. A first stage that brings more hard queries into the top k then lowers the figure even where the
reranker orders every query as before. This reads two captures of one test split (research/confidence_fusion.py's
test.pkl, each ranked by its checkpoint's rule) and gives each figure as evaluated, and both over the queries where
both top ks hold the answer, against only the twins both top ks hold.

  python -m edje.research.paired_within_family --captures A/test.pkl B/test.pkl --checkpoints CK_A CK_B
"""
from __future__ import annotations

import argparse
import json
from typing import Dict, List, Sequence

import numpy as np

from edje.evaluation.recall import answer_and_twins, rerank
from edje.model.ranking import read_ranking
from edje.research.confidence_fusion import Capture, load_capture


def fused_order(c: Capture, checkpoint: str) -> np.ndarray:
    """Each query's candidates in the order the checkpoint's ranking rule puts them."""
    rule = read_ranking(checkpoint)
    return rerank(c.idx, c.itm.shape[1], rule.fuse(c.itm, c.sim))


def paired(captures: Sequence[Capture], orders: Sequence[np.ndarray], queries: np.ndarray) -> Dict:
    """Each capture's within-family accuracy as evaluated, and both over the shared queries and twins."""
    k = captures[0].itm.shape[1]
    own = [[0, 0] for _ in captures]
    shared: List[int] = [0] * len(captures)
    n = 0
    for q in queries:
        found = [answer_and_twins(o[q, :k], c.answers[q], c.group) for c, o in zip(captures, orders)]
        for i, f in enumerate(found):
            if f and f[1]:
                own[i][1] += 1
                own[i][0] += int(all(f[0] < r for r in f[1].values()))
        if all(found):
            common = set.intersection(*(set(f[1]) for f in found))
            if common:
                n += 1
                for i, f in enumerate(found):
                    shared[i] += int(all(f[0] < f[1][t] for t in common))
    return {"as_evaluated": [{"within_family": round(100 * h / t, 2) if t else None, "queries": t} for h, t in own],
            "shared": {"within_family": [round(100 * s / n, 2) if n else None for s in shared], "queries": n}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--captures", nargs=2, required=True, help="two confidence_fusion test.pkl of one test split")
    p.add_argument("--checkpoints", nargs=2, required=True, help="the checkpoint each capture ranks by")
    a = p.parse_args(argv)
    caps = [load_capture(c) for c in a.captures]
    if caps[0].texts != caps[1].texts or caps[0].group is None:
        raise SystemExit("the captures must be of one sample-world test split, with the same queries")
    orders = [fused_order(c, ck) for c, ck in zip(caps, a.checkpoints)]
    base = np.arange(len(caps[0].answers)) if caps[0].base is None else caps[0].base
    out = {"first_captions": paired(caps, orders, base)}
    if caps[0].held is not None:
        out["held_out_templates"] = paired(caps, orders, np.flatnonzero(caps[0].held))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
