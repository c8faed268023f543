"""Work outside the transformer per scored pair: the joint encoder's old per-row pair layout
(research/legacy_pairs.py) beside today's, in one process, calls interleaved.

One query against 1,024 documents through a 1-layer, 32-wide BERT (so the forward is small, as the real
model's is on a GPU): `score` minus the time inside BERT's forward (hooks), plus the layout of one
training step's texts (b=128, k=7). Both layouts give bit-identical scores (checked here and in
tests/test_pair_layout.py).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/pair_layout_bench.py --threads 1
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
from bench_serving import captions, minilm_path, print_table, round_robin, timed

from edje.model.joint_encoder import JointEncoder
from edje.research.legacy_pairs import legacy_score, legacy_tokenize_pairs
from edje.schemas.config import JointEncoderConfig


class ForwardClock:
    """Seconds spent inside one module's forward calls (hooks), so the rest of a call can be told apart."""

    def __init__(self, module: torch.nn.Module, device: torch.device):
        self.seconds, self._start, self._sync = 0.0, 0.0, device.type == "cuda"
        module.register_forward_pre_hook(self._pre)
        module.register_forward_hook(self._post)

    def _pre(self, *_):
        if self._sync:
            torch.cuda.synchronize()
        self._start = time.perf_counter()

    def _post(self, *_):
        if self._sync:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - self._start


def bench_layouts(args, out: dict) -> None:
    """Work outside the transformer per pair: `score` time minus BERT's forward, old layout beside today's."""
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    small = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=512)
    enc = JointEncoder(JointEncoderConfig(tokenizer=minilm_path(), bert_config=small, num_image_tokens=64,
                                          text_embed_dim=32)).to(device).eval()
    clock = ForwardClock(enc.bert.bert, device)
    n = args.docs
    query = captions(1, seed=6)[0]
    tokens = torch.randn(n, 64, enc.hidden_size, device=device)
    paths = {"old (per-row layout)": lambda: legacy_score(enc, [query] * n, tokens),
             "today (distinct texts, tensor layout)": lambda: enc.score([query] * n, tokens)}
    assert torch.equal(paths["old (per-row layout)"](), paths["today (distinct texts, tensor layout)"]())
    rows, figures = [], {}
    with torch.inference_mode():
        for name, fn in paths.items():
            load = os.getloadavg()[0]
            times, inside = [], []
            for rep in range(args.reps + 1):
                before = clock.seconds
                t = timed(fn, 1, warmup=0)
                if rep:  # rep 0 warms up
                    times.append(t), inside.append(clock.seconds - before)
            total, fwd = statistics.median(times), statistics.median(inside)
            outside = min(t - f for t, f in zip(times, inside))  # least-disturbed call of a shared machine
            med_outside = statistics.median(t - f for t, f in zip(times, inside))
            figures[name] = dict(us_per_pair_total=1e6 * total / n, us_per_pair_forward=1e6 * fwd / n,
                                 us_per_pair_outside_min=1e6 * outside / n,
                                 us_per_pair_outside_median=1e6 * med_outside / n,
                                 load_avg_1m=(load, os.getloadavg()[0]))
            f = figures[name]
            rows.append((name, f"{f['us_per_pair_total']:.2f}", f"{f['us_per_pair_forward']:.2f}",
                         f"{f['us_per_pair_outside_median']:.2f}", f"{f['us_per_pair_outside_min']:.2f}",
                         "{:.1f}-{:.1f}".format(*f["load_avg_1m"])))
    out["overhead_1x%d" % n] = figures
    print_table(f"work outside the transformer, 1 query x {n} documents, 1-layer 32-wide BERT, compressed-64, "
                f"{device}, {args.threads} thread(s) (us per pair)", rows,
                ("layout", "score", "BERT forward", "outside (median)", "outside (min)", "load avg 1m"))

    # One training step's texts (b=128, k=7): positives, each caption k times, k negative captions each.
    caps = captions(128, seed=7)
    texts = caps + [c for c in caps for _ in range(7)] + [caps[(i * 37) % 128] for i in range(128 * 7)]
    step = {"old": lambda: legacy_tokenize_pairs(enc, texts, 64),
            "today, cold cache": lambda: (enc.wordpiece_cache._rows.clear(), enc.tokenize_pairs(texts, 64)),
            "today, warm cache": lambda: enc.tokenize_pairs(texts, 64)}
    load = os.getloadavg()[0]
    seconds = round_robin(step, args.reps)
    out["training_step_layout_ms"] = {k: 1e3 * v for k, v in seconds.items()}
    print_table(f"layout of one training step's {len(texts)} texts (b=128, k=7), load avg 1m {load:.1f}-"
                f"{os.getloadavg()[0]:.1f}", [(k, f"{1e3 * v:.2f}") for k, v in seconds.items()], ("layout", "ms"))


def main(argv=None) -> None:
    """Time both layouts and print the tables (and write the figures to --json)."""
    import transformers

    transformers.logging.set_verbosity_error()  # the MLM/classifier heads are newly initialised on purpose
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--docs", type=int, default=1024, help="documents of the one query")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    out: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
                 "load_avg_at_start": os.getloadavg(),
                 "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"}
    print(f"# pair_layout_bench: {out['machine']}, device {out['device_name']}, threads {args.threads}")
    bench_layouts(args, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
