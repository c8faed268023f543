"""Do stored tokens say WHERE an object is? A ridge probe of an object's centre from raw backbone tokens and
from each checkpoint's adapter output (the tokens a reranker reads).

Relations need it: "A left of B" is a comparison of two positions, so a reranker can only learn relations
from tokens that carry them. The object is addressed by an attribute (the alphabetically first colour in
the scene), as a caption's noun addresses it. R^2 of (x, y) on held-out images; 0 = no better than the mean.

  python benchmarks/probe_positions.py --tables runs/comp/c16d/tables/train --world runs/rel/world100 \\
      --model local=checkpoints/edje-local-bind --model c16=checkpoints/edje-c16-bind --images 4000
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pyarrow.compute as pc
import torch

from edje.evaluation.probes import fit_probe
from edje.model.edje import load_checkpoint
from edje.sampleworld.scene import Scene
from edje.sampleworld.world import load_world
from edje.schemas.token_table import decode_tokens, expand_paths, read_token_tables


def addressed_centre(scene: Scene) -> tuple:
    """Centre of the object with the alphabetically first colour (an attribute-addressed object)."""
    return min(scene.objects, key=lambda o: o.colour).center


def main(argv=None) -> dict:
    """CLI entry point; returns {features: R^2} and prints it."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", nargs="+", required=True, help="raw token tables of the world's images")
    p.add_argument("--world", required=True, help="the sample world the tables were encoded from")
    p.add_argument("--model", action="append", default=[], metavar="NAME=CHECKPOINT")
    p.add_argument("--images", type=int, default=4000, help="distinct images used (3/4 fit, 1/4 scored)")
    a = p.parse_args(argv)
    table, meta = read_token_tables(expand_paths(a.tables))
    ids = table.column("image_id")
    first = pc.index_in(pc.unique(ids), ids).to_numpy()[:a.images]  # one row per image
    table = table.take(first)
    by_id = load_world(a.world).by_id()
    y = np.array([addressed_centre(by_id[i].scene) for i in table.column("image_id").to_pylist()], np.float64)
    raw = torch.from_numpy(np.ascontiguousarray(decode_tokens(table, meta))).float()
    features = {"raw backbone tokens": raw.numpy()}
    for spec in a.model:
        name, _, path = spec.partition("=")
        with torch.no_grad():
            features[f"{name} adapter output"] = load_checkpoint(path).adapter(raw).numpy()
    cut = len(y) * 3 // 4
    out = {}
    for name, x in features.items():
        x = x.reshape(len(x), -1)
        r = fit_probe(name, x[:cut], y[:cut], x[cut:], y[cut:], multilabel=False, regression=True)
        out[name] = {"r2": round(r.accuracy, 3), "shape": list(features[name].shape[1:]), "alpha": r.alpha}
        print(f"{name:<32} R^2 of the addressed object's centre: {r.accuracy:.3f} (tokens {out[name]['shape']})",
              flush=True)
    print(json.dumps({"images": len(y), "probes": out}))
    return out


if __name__ == "__main__":
    main()
