"""GPU smoke: every GPU-bound path of the project in one command, then the throughput figures.

    .venv/bin/python benchmarks/gpu_smoke.py                       # on a GPU machine (--device cuda)
    .venv/bin/python benchmarks/gpu_smoke.py --device cpu --quick  # the same stages on the CPU (tests)
    .venv/bin/python benchmarks/gpu_smoke.py --jobs                # + the same through the jobs (needs Ray)

Runs where Ray is not installed: the GPU-bound pieces are driven in-process, on a small sample world
generated here, with the shipped small backbone (checkpoints/edje-tiny-convvit-sw.safetensors):

1. `encode-raw`: the encode actor class (pipeline/encode.py EncodeBatch) on the world's images, its
   output written and committed by the pipeline's own writer (pipeline/write.py) into raw fp16 tables;
   the stored tokens are checked against a CPU fp32 reference within the fp16 codec's bound.
2. `train`: 20 optimizer steps through the Ray Train worker loop's own pieces (training/loop.py:
   BatchPlanner batches, step_inputs = decode + in-batch mining, train_step with EDJEObjectives,
   learning_rate, build_optimizer) on the device, over the raw table; the result is the checkpoint
   the next stages use. `train-backbone`: two epochs of the small backbone's contrastive training
   (training/backbone.py, as jobs/train_backbone.py runs it) with `device=`.
3. `encode-int8`: EncodeBatch with that checkpoint's compression adapter, int8 tables; the stored
   tokens are checked against a CPU fp32 reference within the int8 codec's bound (half a step).
4. `evaluate`: evaluation/rerank_eval.py (FAISS first stage, EDJE reranking) with `device=`, and its
   scores on the device against the same scores on the CPU.
5. `serve`: the Serve reranker's scorer (model/scoring.py PairScorer, as serving/reranker_core.py runs it) on the device at fp32 and at
   the served default precision ("auto"), against the evaluation's CPU fp32 scores; FirstStage and the
   miner (serving/first_stage.py, serving/miner.py) built in-process with `device=`.

Bounds (stated, checked per value): stored - reference <= codec bound(reference) + compute slack x
absmax of the token. Codec bound: fp16 2^-11 |x| + 2^-25 (half an fp16 ulp); int8 half a step,
absmax / 127 / 2 x (1 + 2^-10) (the fp16 scale is rounded up by at most one fp16 ulp). Compute slack
(how far the device's arithmetic may move a token from the CPU fp32 one before it is stored): CPU
2^-20, CUDA fp32 2^-12, bf16 2^-4 (the encode actor's `compute_dtype`).

`--jobs` (only where Ray is importable) runs the same through the jobs as subprocesses:
jobs/encode_cc12m.py (raw), jobs/pretrain.py --use-gpu, jobs/encode_cc12m.py --adapter (int8), and
jobs/serve.py --reranker-gpus 1 answering one /v1/rerank request (without a GPU: the same with no GPUs).

Throughput (skipped with --quick): ViT-L-16-SigLIP2-384 images/s through EncodeBatch (random
weights, random 64 x 384 compression adapter, int8 tables), and compressed-64 pairs/s of a
MiniLM-L12-H384-shaped joint encoder in bf16 at forward batches 64 to 4,096
(benchmarks/bench_serving.py's encoder). Each figure is printed with the device name and its share of
the device's dense bf16 peak (benchmarks/bench_encode.py's table; unknown devices: no share). FLOPs are
approximated as 2 x parameters x tokens per image or pair (the matmuls of a forward; attention's
score and value products, ~2 x tokens^2 x width per layer, are left out, so the share reads low).

Each stage prints PASS or FAIL; the exit status is 1 when any stage failed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional

from edje.serving.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

# Slack of the device's arithmetic against the CPU fp32 reference, as a share of a token's absmax.
COMPUTE_SLACK = {"cpu": 2.0 ** -20, "cuda": 2.0 ** -12, "bf16": 2.0 ** -4}
SERVED_FP32_TOL = 1e-4  # served fp32 logits vs evaluation's CPU fp32 logits: equal within 1e-4
EVAL_DEVICE_TOL = 1e-4  # evaluation's logits on the device vs on the CPU
SMALL_BERT = (("hidden_size", 64), ("num_hidden_layers", 2), ("num_attention_heads", 2), ("intermediate_size", 128))


class Failed(AssertionError):
    """A stage's check did not hold."""


def check(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)


def ray_available() -> bool:
    """Whether Ray is importable here (the --jobs stages need it; the in-process stages do not)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------------- the stages
class Smoke:
    """The in-process stages, sharing one work folder; each returns a line of detail or raises."""

    def __init__(self, args: argparse.Namespace, work: Path):
        import torch

        from edje.model.device import pick_device

        self.args, self.work = args, work
        self.device = pick_device(args.device)
        self.threads = args.threads
        torch.set_num_threads(self.threads)
        self.dtype_kw = {}
        self.slack = COMPUTE_SLACK["cpu" if self.device.type == "cpu" else "cuda"]
        self.world = self.raw_tables = self.checkpoint = self.int8_table = None

    # -- shared pieces
    def spec(self, adapter: Optional[str], quant: str):
        import dataclasses

        from edje.model.backbone import default_feature_layer
        from edje.pipeline.encode import EncoderSpec
        from edje.schemas.config import BackboneConfig
        from edje.schemas.shipped import DEFAULT_BACKBONE
        from edje.schemas.weights import find_weights

        bb = BackboneConfig(DEFAULT_BACKBONE, find_weights(backbone=DEFAULT_BACKBONE), default_feature_layer(DEFAULT_BACKBONE))
        extra = {}
        if "compute_dtype" in {f.name for f in dataclasses.fields(EncoderSpec)}:
            extra["compute_dtype"] = self.args.compute_dtype
            if self.args.compute_dtype == "bf16":
                self.slack = COMPUTE_SLACK["bf16"]
        return EncoderSpec(bb, adapter, quant, None, torch_threads=self.threads, **extra)

    def images(self, split: str, size: int, resize_mode: str):
        """(image ids, first captions, decoded uint8 images [N, S, S, 3]) of a split, as the decode stage makes them."""
        import numpy as np

        from edje.model.image_decode import decode_image

        recs = [r for r in self.world.images if r.split == split]
        pixels = np.stack([decode_image((self.world.root / r.image).read_bytes(), size, resize_mode) for r in recs])
        return [r.image_id for r in recs], [r.captions[0] for r in recs], pixels

    def encode(self, spec, shards: Dict[int, str], output: Path):
        """EncodeBatch over the shards' images (shard id -> split), written and committed by pipeline/write.py."""
        import numpy as np

        from edje.pipeline.encode import EncodeBatch, describe_model
        from edje.pipeline.write import commit_shard, write_parts

        info = describe_model(spec)
        actor = EncodeBatch(spec)
        check(actor.encoder.device.type == self.device.type, f"EncodeBatch chose {actor.encoder.device}, expected {self.device}")
        data, tables = {}, []
        for sid, split in shards.items():
            ids, caps, pixels = self.images(split, info.image_size, info.resize_mode)
            data[sid] = (ids, pixels)
            parts = []
            bs = self.args.encode_batch
            for lo in range(0, len(ids), bs):
                n = len(ids[lo:lo + bs])
                batch = {"status": np.array(["ok"] * n, dtype=object), "image": pixels[lo:lo + n],
                         "caption": np.array(caps[lo:lo + n], dtype=object), "shard": np.full(n, sid, np.int32),
                         "row": np.arange(lo, lo + n, dtype=np.int32), "image_id": np.array(ids[lo:lo + n], dtype=object),
                         "url": np.array([f"file://{i}" for i in ids[lo:lo + n]], dtype=object),
                         "detail": np.array([""] * n, dtype=object)}
                parts += write_parts(actor(batch), str(output)).column("part").to_pylist()
            stats = commit_shard(str(output), sid, parts, len(ids), info.meta.to_bytes().decode())
            check(stats["images_ok"] == len(ids), f"shard {sid}: {stats['images_ok']} of {len(ids)} rows committed")
            tables.append(stats["table"])
        return info, actor, data, tables

    def compare_to_reference(self, table_path: str, ids, pixels, adapter=None) -> str:
        """Stored tokens and embeddings vs a CPU fp32 reference (backbone [+ adapter]) within the stated bound."""
        import numpy as np
        import torch

        from edje.model.backbone import VisionBackbone
        from edje.schemas.token_table import decode_tokens, read_token_table, vector_matrix

        table, meta = read_token_table(table_path)
        order = {x: i for i, x in enumerate(table.column("image_id").to_pylist())}
        rows = np.array([order[i] for i in ids])
        stored = decode_tokens(table, meta)[rows]
        emb = vector_matrix(table.column("image_embedding"))[rows]
        with torch.no_grad():
            ref_bb = VisionBackbone.create(self.spec(None, "fp32").backbone)  # CPU, fp32
            ref, ref_emb = ref_bb.encode(torch.from_numpy(pixels))
            if adapter is not None:
                ref = adapter(ref)
        ref, ref_emb = ref.float().numpy(), ref_emb.numpy()
        absmax = np.abs(ref).max(axis=-1, keepdims=True)
        if meta.quantization == "fp16":
            codec = np.abs(ref) * 2.0 ** -11 + 2.0 ** -25
        elif meta.quantization == "int8":
            codec = absmax / 127 / 2 * (1 + 2.0 ** -10) + absmax * 2.0 ** -20
        else:
            raise Failed(f"no stated bound for {meta.quantization} here")
        bound = codec + self.slack * absmax
        err = np.abs(stored - ref)
        excess = float((err - bound).max())
        check(excess <= 0, f"{meta.quantization} tokens off the CPU reference by {excess:.3g} beyond the bound")
        emb_err = float(np.abs(emb - ref_emb).max())
        check(emb_err <= self.slack * 4, f"image embeddings off the CPU reference by {emb_err:.3g}")
        return (f"{len(ids)} images, {meta.num_tokens}x{meta.width} {meta.quantization}, worst err/bound "
                f"{float((err / bound).max()):.3f}, embedding err {emb_err:.2g}")

    # -- 1. raw tables
    def encode_raw(self) -> str:
        from edje.sampleworld.world import WorldConfig, generate

        a = self.args
        self.world = generate(WorldConfig(seed=17, n_train=a.train_images, n_val=0, n_test=a.test_images,
                                          image_size=64 if a.quick else 128), self.work / "world")
        info, actor, data, tables = self.encode(self.spec(None, "fp16"), {0: "train", 1: "test"}, self.work / "raw")
        self.raw_tables = tables
        details = [self.compare_to_reference(t, *data[sid]) for sid, t in zip((0, 1), tables)]
        return f"on {actor.encoder.device}: " + "; ".join(details)

    # -- 2. training steps
    def train(self) -> str:
        import torch

        from edje.model.edje import save_checkpoint
        from edje.schemas.token_table import read_token_table, vector_matrix
        from edje.training.config import ModelSpec, TrainJobConfig
        from edje.training.loop import Position, build_optimizer, learning_rate, order_rows, planned_batches, step_inputs, train_step
        from edje.training.mining import MinerConfig
        from edje.training.model_init import build_model
        from edje.training.objectives import EDJEObjectives
        from edje.training.sampler import BatchPlanner

        check(self.raw_tables is not None, "needs the raw tables of encode-raw")
        steps = self.args.train_steps
        cfg = TrainJobConfig(tables=[self.raw_tables[0]], storage_path=str(self.work / "train"), name="smoke",
                             model=ModelSpec(adapter="compressed", num_queries=16, adapter_hidden=128, adapter_heads=4,
                                             bert_config=SMALL_BERT),
                             batch_size=8, k=2, warmup_steps=5, max_steps=steps, epochs=10 ** 6)
        table, meta = read_token_table(cfg.tables[0])
        table = order_rows(table)
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, meta).to(self.device)
        objectives = EDJEObjectives(model, cfg.objectives, {k: float(v) for k, v in cfg.loss_weights})
        optimizer = build_optimizer(objectives, cfg)
        planner = BatchPlanner(table.column("image_id").to_pylist(), vector_matrix(table.column("image_embedding")),
                               cfg.batch_size, cfg.curriculum, cfg.seed * 7919)
        check(planner.batches_per_epoch >= 1, f"{planner.num_images} images: less than one batch")
        miner_cfg = MinerConfig(k=cfg.k, strategy=cfg.mining, temperature=cfg.mining_temperature)
        generator = torch.Generator().manual_seed(cfg.seed * 1000)
        before = {n: p.detach().clone() for n, p in objectives.named_parameters() if p.requires_grad}
        pos, rows = Position(), []
        while pos.step < steps:
            for i, raw in planned_batches(table, planner, planner.batches_per_epoch, pos):
                batch, neg, t_logits = step_inputs(raw, meta, self.device, miner_cfg, generator)
                out = train_step(objectives, objectives, optimizer, batch, neg, learning_rate(cfg, pos.step, steps), t_logits)
                pos.step, pos.batch_in_epoch = pos.step + 1, i + 1
                rows.append({k: float(v.detach()) for k, v in out.items()})
                if pos.step >= steps:
                    break
            else:
                pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0
        check(len(rows) == steps, f"{len(rows)} steps taken, {steps} asked")
        bad = [r for r in rows if not all(math.isfinite(v) for v in r.values())]
        check(not bad, f"non-finite losses: {bad[:2]}")
        devices = {p.device.type for p in objectives.parameters()}
        check(devices == {self.device.type}, f"parameters on {devices}")
        moved = sum(not torch.equal(before[n], p.detach()) for n, p in objectives.named_parameters() if n in before)
        check(moved > 0.9 * len(before), f"only {moved} of {len(before)} trained tensors changed")
        self.checkpoint = str(self.work / "checkpoint")
        save_checkpoint(model.cpu(), self.checkpoint)
        first, last = rows[0], rows[-1]
        return (f"{steps} steps on {self.device}, loss {first['loss']:.3f} -> {last['loss']:.3f} "
                f"(itm {first.get('loss_itm', float('nan')):.3f} -> {last.get('loss_itm', float('nan')):.3f}), "
                f"{moved}/{len(before)} tensors updated")

    # -- 2b. backbone training (jobs/train_backbone.py's function)
    def train_backbone(self) -> str:
        from safetensors.torch import load_file

        from edje.sampleworld.world import annotation_path
        from edje.schemas.shipped import DEFAULT_BACKBONE
        from edje.training.backbone import BackboneTrainConfig, train_backbone

        check(self.world is not None, "needs the sample world of encode-raw")
        out = self.work / "backbone" / "smoke.safetensors"
        record = train_backbone(BackboneTrainConfig(
            train_annotations=str(annotation_path(self.world.root, "train")), output=str(out),
            eval_annotations=str(annotation_path(self.world.root, "test")), model=DEFAULT_BACKBONE, epochs=2,
            batch_size=16, warmup_steps=2, eval_every=2, device=self.args.device), log=lambda line: None)
        check(record["complete"] and record["config"]["device"] == self.args.device, f"record {record['config']}")
        state = load_file(str(out))
        check(all(bool(v.float().isfinite().all()) for v in state.values()), "non-finite backbone weights")
        return (f"{record['history'][-1]['step']} steps on {self.args.device}, loss {record['history'][-1]['loss']}, "
                f"zero-shot T2I R@1 {record['final_recall']['t2i']['r1']}")

    # -- 3. compressed int8 tables
    def encode_int8(self) -> str:
        from edje.model.edje import load_checkpoint
        from edje.pipeline.encode import _load_adapter
        from edje.schemas.token_table import read_metadata

        check(self.checkpoint is not None, "needs the checkpoint of train")
        info, actor, data, tables = self.encode(self.spec(self.checkpoint, "int8"), {1: "test"}, self.work / "int8")
        self.int8_table = tables[0]
        meta = read_metadata(self.int8_table)
        check(meta.kind == "compressed" and meta.adapter_hash == load_checkpoint(self.checkpoint).adapter_hash(),
              "compressed table's adapter hash differs from the checkpoint's")
        adapter = _load_adapter(self.checkpoint)[0]  # CPU fp32 reference adapter
        return f"on {actor.encoder.device}: " + self.compare_to_reference(self.int8_table, *data[1], adapter=adapter)

    # -- 4. evaluation
    def evaluate(self) -> str:
        import numpy as np
        import torch

        from edje.evaluation.rerank_eval import EvalConfig, evaluate, score_pairs
        from edje.model.scoring import PairScorer
        from edje.sampleworld.world import annotation_path
        from edje.schemas.token_table import decode_tokens, read_token_table

        check(self.int8_table is not None, "needs the int8 table of encode-int8")
        out = self.work / "eval"
        cfg = EvalConfig(annotations=str(annotation_path(self.world.root, "test")), tokens=[self.int8_table],
                         output=str(out), checkpoint=self.checkpoint, k=5, examples=1, threads=self.threads,
                         device=self.args.device)
        metrics = evaluate(cfg)
        run = json.loads((out / "run.json").read_text())
        check(torch.device(run["device"]).type == self.device.type, f"evaluation ran on {run['device']}")
        for d in ("t2i", "i2t"):
            for stage in ("first_stage", "reranked"):
                r = metrics[d][stage]
                check(0 <= r["r1"] <= r["r5"] <= r["r10"] <= 100, f"{d} {stage} recall {r}")
        # The same scoring function on the device and on the CPU.
        table, meta = read_token_table(self.int8_table)
        tokens = torch.from_numpy(decode_tokens(table, meta))
        caps = table.column("caption").to_pylist() if "caption" in table.column_names else None
        texts = caps or [r.captions[1] for r in self.world.images if r.split == "test"][:len(tokens)]
        idx = np.arange(len(tokens))[::-1].copy()
        texts = [texts[i % len(texts)] for i in range(len(tokens))]
        on_cpu = score_pairs(PairScorer.from_checkpoint(self.checkpoint, "cpu", "fp32", 64), texts, idx, tokens)
        on_dev = score_pairs(PairScorer.from_checkpoint(self.checkpoint, self.device, "fp32", 64), texts, idx,
                             tokens.to(self.device))
        diff = float(np.abs(on_cpu - on_dev).max())
        check(diff <= EVAL_DEVICE_TOL, f"evaluation logits on {self.device} differ from the CPU's by {diff:.3g}")
        return (f"on {run['device']}: T2I R@1 {metrics['t2i']['first_stage']['r1']} -> {metrics['t2i']['reranked']['r1']}, "
                f"logits vs CPU max diff {diff:.2g} (<= {EVAL_DEVICE_TOL:g})")

    # -- 5. serving
    def serve(self) -> str:
        import numpy as np
        import torch

        from edje.model.edje import load_checkpoint, read_checkpoint_config
        from edje.model.scoring import PairScorer
        from edje.sampleworld.world import annotation_path
        from edje.serving.first_stage import FirstStage
        from edje.serving.miner import Miner
        from edje.serving.reranker_core import PairChunk, score_chunks
        from edje.storage.token_store import TokenStore

        check(self.int8_table is not None, "needs the int8 table of encode-int8")
        store = TokenStore.load([self.int8_table], read_checkpoint_config(self.checkpoint))
        recs = [r for r in self.world.images if r.split == "test"]
        ids = [r.image_id for r in recs]
        texts = [recs[(i + 1) % len(recs)].captions[0] if i % 2 else recs[i].captions[0] for i in range(len(recs))]
        got = store.gather_blobs(ids)
        check(not got.missing, f"token store lacks {got.missing[:3]}")
        reference = load_checkpoint(self.checkpoint).eval()  # evaluation's path: CPU, fp32
        with torch.inference_mode():
            ref = reference.encoder.score(texts, torch.from_numpy(store.codec.decode(got.blob, got.scales))).numpy()
        lines = []
        for precision in ("fp32", "auto"):
            scorer = PairScorer.from_checkpoint(self.checkpoint, self.device, precision)
            check(next(scorer.model.parameters()).device.type == self.device.type, f"scorer on {scorer.device}")
            logits = score_chunks(scorer, store.meta, [PairChunk(texts[:5], got.blob[:5], None if got.scales is None else got.scales[:5]),
                                          PairChunk(texts[5:], got.blob[5:], None if got.scales is None else got.scales[5:])])
            logits = np.concatenate(logits)
            check(np.isfinite(logits).all(), f"{precision}: non-finite logits")
            diff = float(np.abs(logits - ref).max())
            if scorer.precision == "fp32":
                check(diff <= SERVED_FP32_TOL, f"served fp32 logits differ from evaluation's by {diff:.3g}")
            lines.append(f"{precision}={scorer.precision} max |served - evaluated| {diff:.2g}")
        fs = FirstStage([self.int8_table], torch_threads=self.threads, device=self.args.device)
        check(fs.backbone._mean.device.type == self.device.type, f"first-stage text tower on {fs.backbone._mean.device}")
        hits = fs.search(recs[0].captions[0], 5)
        check(len(hits) == 5 and all(h[0] in set(ids) for h in hits), f"first stage answered {hits}")
        miner = Miner([self.int8_table], [str(annotation_path(self.world.root, "test"))],
                                   torch_threads=self.threads, device=self.args.device)
        check(miner.backbone._mean.device.type == self.device.type, f"miner text tower on {miner.backbone._mean.device}")
        mined = asyncio.run(miner.negatives(ids[:2], [recs[0].captions[0], "an unseen caption"], k=2))
        check("negatives" in mined and all(len(n["negative_images"]) == 2 for n in mined["negatives"]), f"miner: {mined}")
        return f"on {self.device}: " + "; ".join(lines) + "; first stage + miner text towers on " + str(self.device)


# ------------------------------------------------------------------------------------ --jobs
def run_jobs(args: argparse.Namespace, work: Path) -> Dict[str, Callable[[], str]]:
    """The same path through the jobs as subprocesses (encode raw -> pretrain -> encode int8 -> serve + 1 request)."""
    import subprocess

    import torch

    gpu = torch.cuda.is_available() and args.device != "cpu"
    py, jobs = sys.executable, ROOT / "jobs"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    root = work / "jobs"
    state: dict = {}

    def run(cmd: List[str], timeout: int) -> str:
        proc = subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        text = proc.stdout + proc.stderr
        check(proc.returncode == 0, f"{Path(str(cmd[1])).name} exited {proc.returncode}: {text[-2000:]}")
        return text

    def encode_cmd(output: Path, *extra) -> list:
        cmd = [py, jobs / "encode_cc12m.py", "--output", output, "--world-dir", root / "world", "--world-images", "48",
               "--batch-size", "16", "--shard-size", "24", "--address", "local", *extra]
        return cmd + (["--gpus-per-worker", "1", "--concurrency", "1"] if gpu else [])

    def encode_raw() -> str:
        run(encode_cmd(root / "raw"), 900)
        summary = json.loads((root / "raw" / "summary.json").read_text())
        check(summary["complete"] and summary["images_ok"] > 40, f"summary {summary}")
        return f"{summary['images_ok']} images, {summary.get('images_per_second')} img/s"

    def pretrain() -> str:
        state["export"] = root / "export"
        cmd = [py, jobs / "pretrain.py", "--tables", root / "raw" / "tables", "--storage-path", root / "train",
               "--name", "smoke", "--export", state["export"], "--num-workers", "1", "--batch-size", "8", "--k", "2",
               "--max-steps", str(args.train_steps), "--checkpoint-every", str(args.train_steps), "--warmup-steps", "5",
               "--adapter", "compressed", "--num-queries", "16", "--adapter-hidden", "128", "--adapter-heads", "4",
               "--random-bert", *[f"{k}={v}" for k, v in SMALL_BERT]]
        text = run(cmd + (["--use-gpu"] if gpu else []), 900)
        check((state["export"] / "config.json").exists(), "no exported checkpoint: " + text[-1000:])
        return f"{args.train_steps} steps{' --use-gpu' if gpu else ''}, exported"

    def encode_int8() -> str:
        check("export" in state, "needs pretrain's checkpoint")
        run(encode_cmd(root / "int8", "--adapter", state["export"], "--quant", "int8"), 900)
        summary = json.loads((root / "int8" / "summary.json").read_text())
        check(summary["complete"], f"summary {summary}")
        return f"{summary['images_ok']} images, {summary.get('images_per_second')} img/s"

    def serve() -> str:
        import signal
        import urllib.request

        check("export" in state, "needs pretrain's checkpoint")
        port = free_port()
        tables = sorted(str(p) for p in (root / "int8" / "tables").glob("*.parquet"))
        cmd = [py, jobs / "serve.py", "--checkpoint", state["export"], "--tokens", *tables, "--address", "local",
               "--port", str(port), "--block", "--reranker-gpus", "1" if gpu else "0"]
        log = open(root / "serve.log", "w")
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            deadline = time.time() + 600
            while time.time() < deadline and proc.poll() is None and '"url"' not in (root / "serve.log").read_text():
                time.sleep(2)
            check(proc.poll() is None, "serve.py exited: " + (root / "serve.log").read_text()[-2000:])
            import pyarrow.parquet as pq
            ids = pq.read_table(tables[0], columns=["image_id"]).column("image_id").to_pylist()[:4]
            body = json.dumps({"query": "a red circle", "documents": ids}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/rerank", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                answer = json.loads(r.read())
            check(len(answer["results"]) == len(ids), f"answer {answer}")
            info = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/info", timeout=60).read())
            return (f"1 /v1/rerank request, {len(ids)} documents ranked by a reranker replica at precision "
                    f"{info.get('precision')}{' with 1 GPU' if gpu else ' (no GPU here)'}")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()

    return {"jobs: encode_cc12m raw": encode_raw, "jobs: pretrain": pretrain,
            "jobs: encode_cc12m int8": encode_int8, "jobs: serve + request": serve}


# ------------------------------------------------------------------------------- throughput
def peak_tflops(device) -> tuple:
    """(device name, dense bf16 peak TFLOP/s or None)."""
    import torch
    from bench_encode import BF16_PEAK_TFLOPS

    if device.type != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(device)
    return name, next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)


def share(flops_per_item: float, rate: float, peak: Optional[float]) -> str:
    return f"{100 * flops_per_item * rate / (peak * 1e12):.1f}% of {peak:g} TFLOPS" if peak else "peak unknown"


def throughput_encode(args, work: Path, figures: dict) -> str:
    """ViT-L-16-SigLIP2-384 images/s through EncodeBatch (random weights, random compression adapter, int8)."""
    import dataclasses

    import numpy as np
    from bench_encode import random_adapter_checkpoint

    from edje.pipeline.encode import EncodeBatch, EncoderSpec
    from edje.schemas.config import BackboneConfig

    name = "ViT-L-16-SigLIP2-384"
    extra = {"compute_dtype": "bf16"} if "compute_dtype" in {f.name for f in dataclasses.fields(EncoderSpec)} else {}
    ckpt = random_adapter_checkpoint(work / "adapter-vitl", 1024)
    actor = EncodeBatch(EncoderSpec(BackboneConfig(name), ckpt, "int8", None, torch_threads=args.threads, **extra))
    size, b = actor.encoder.backbone.preprocess.size, args.encode_batch_gpu
    rng = np.random.default_rng(0)
    batch = {"status": np.array(["ok"] * b, dtype=object), "image": rng.integers(0, 256, (b, size, size, 3), np.uint8),
             "caption": np.array(["x"] * b, dtype=object), "shard": np.zeros(b, np.int32), "row": np.arange(b, dtype=np.int32),
             "image_id": np.array([str(i) for i in range(b)], dtype=object), "url": np.array([""] * b, dtype=object),
             "detail": np.array([""] * b, dtype=object)}
    actor(batch)  # warm-up (returns host arrays: the device is synchronised)
    n_batches = max(1, args.encode_images // b)
    t = time.perf_counter()
    for _ in range(n_batches):
        actor(batch)
    rate = n_batches * b / (time.perf_counter() - t)
    params = sum(p.numel() for p in actor.encoder.backbone.visual.parameters())
    tokens = actor.encoder.backbone.token_shape[0]
    flops = 2 * params * tokens
    dev, peak = peak_tflops(actor.encoder.device)
    figures["encode"] = dict(model=name, device=dev, images_per_s=round(rate, 1), batch=b,
                             compute_dtype=extra.get("compute_dtype", "autocast"),
                             gflops_per_image_approx=round(flops / 1e9, 1), bf16_peak_tflops=peak)
    return (f"{name} through EncodeBatch on {dev}: {rate:,.1f} images/s (batch {b}, {extra.get('compute_dtype', 'bf16 autocast')}), "
            f"~{flops / 1e9:.0f} GFLOP/img (2 x {params / 1e6:.0f}M params x {tokens} tokens), {share(flops, rate, peak)}")


def throughput_pairs(args, figures: dict) -> str:
    """compressed-64 pairs/s of a MiniLM-L12-H384-shaped joint encoder at batches 64..4096 (bench_serving.py's)."""
    import torch
    from bench_serving import DTYPES, captions, encoder_config, timed

    from edje.model.device import pick_device
    from edje.model.joint_encoder import JointEncoder

    device = pick_device(args.device)
    dtype = DTYPES[args.pairs_dtype]
    enc = JointEncoder(encoder_config("l12", 64)).to(device, dtype).eval()
    layers = sum(p.numel() for n, p in enc.bert.named_parameters() if ".encoder." in n or n.startswith("encoder."))
    texts = captions(max(args.pair_batches), seed=3)
    tokens = torch.randn(max(args.pair_batches), 64, enc.hidden_size, device=device, dtype=dtype)
    dev, peak = peak_tflops(device)
    rows, out = [], {}
    for b in args.pair_batches:
        seq = enc.tokenize_pairs(texts[:b], 64).input_ids.shape[1]
        with torch.inference_mode():
            seconds = timed(lambda b=b: enc.score(texts[:b], tokens[:b]), args.pair_reps)
        rate = b / seconds
        flops = 2 * layers * seq
        out[b] = dict(pairs_per_s=round(rate, 1), tokens_per_pair=seq, gflops_per_pair_approx=round(flops / 1e9, 3))
        rows.append(f"b{b}: {rate:,.1f} pairs/s ({share(flops, rate, peak)})")
    figures["pairs"] = dict(model="MiniLM-L12-H384-shaped, compressed-64", device=dev, dtype=args.pairs_dtype,
                            bf16_peak_tflops=peak, by_batch=out)
    return (f"compressed-64, L12-H384 {args.pairs_dtype} on {dev}; FLOPs ~ 2 x {layers / 1e6:.1f}M encoder params x "
            f"tokens per pair: " + ", ".join(rows))


# ------------------------------------------------------------------------------------- main
def run_stage(name: str, fn: Callable[[], str], results: List[dict]) -> None:
    t = time.perf_counter()
    try:
        detail, status = fn(), "PASS"
    except Exception as e:
        if not isinstance(e, Failed):
            traceback.print_exc()
        detail, status = f"{type(e).__name__}: {e}", "FAIL"
    seconds = time.perf_counter() - t
    results.append(dict(stage=name, status=status, seconds=round(seconds, 1), detail=detail))
    print(f"[gpu-smoke] {status} {name} ({seconds:.1f} s): {detail}", flush=True)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 1)[1])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu; cpu hides the GPUs from this process")
    p.add_argument("--quick", action="store_true", help="small world, no throughput figures (tests)")
    p.add_argument("--jobs", action="store_true", help="also run the jobs as subprocesses (needs Ray)")
    p.add_argument("--compute-dtype", default="fp32", choices=["fp32", "bf16"],
                   help="the encode actor's arithmetic in the stages (where pipeline/encode.py has compute_dtype)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 with --quick, else 4)")
    p.add_argument("--train-images", type=int, default=None, help="sample-world train images (default 32 quick, 64)")
    p.add_argument("--test-images", type=int, default=None, help="sample-world test images (default 16 quick, 32)")
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--encode-batch", type=int, default=16, help="images per EncodeBatch call in the stages")
    p.add_argument("--encode-images", type=int, default=4096, help="throughput: images timed through EncodeBatch")
    p.add_argument("--encode-batch-gpu", type=int, default=256, help="throughput: images per EncodeBatch call")
    p.add_argument("--pair-batches", type=int, nargs="+", default=[64, 256, 1024, 4096])
    p.add_argument("--pair-reps", type=int, default=10)
    p.add_argument("--pairs-dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--workdir", help="keep the files here (default: a temporary folder, removed)")
    p.add_argument("--json", help="also write the stage results and figures here")
    args = p.parse_args(argv)
    args.threads = args.threads or (1 if args.quick else 4)
    args.train_images = args.train_images or (32 if args.quick else 64)
    args.test_images = args.test_images or (16 if args.quick else 32)
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch: every piece that picks "cuda if available" sees none
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # heads of the random models are newly initialised on purpose
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"[gpu-smoke] FAIL setup: --device {args.device} but no CUDA device is visible "
              "(use --device cpu to run the same stages on the CPU)")
        return 1
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="gpu-smoke-")
    work = Path(args.workdir or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    has_ray = ray_available()
    print(f"[gpu-smoke] device {args.device} ({name}), torch {torch.__version__}, ray "
          f"{'present' if has_ray else 'absent'}, work {work}", flush=True)
    results: List[dict] = []
    figures: dict = {}
    smoke = Smoke(args, work)
    for stage, fn in (("encode-raw", smoke.encode_raw), ("train", smoke.train), ("train-backbone", smoke.train_backbone),
                      ("encode-int8", smoke.encode_int8),
                      ("evaluate", smoke.evaluate), ("serve", smoke.serve)):
        run_stage(stage, fn, results)
    if args.jobs:
        if has_ray:
            for stage, fn in run_jobs(args, work).items():
                run_stage(stage, fn, results)
        else:
            results.append(dict(stage="jobs", status="FAIL", seconds=0, detail="--jobs needs Ray, which is not importable"))
            print("[gpu-smoke] FAIL jobs: --jobs needs Ray, which is not importable")
    if not args.quick:
        run_stage("throughput: encode", lambda: throughput_encode(args, work, figures), results)
        run_stage("throughput: pairs", lambda: throughput_pairs(args, figures), results)
    failed = [r["stage"] for r in results if r["status"] != "PASS"]
    print(f"[gpu-smoke] {len(results) - len(failed)}/{len(results)} stages passed"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "device_name": name, "stages": results,
                                               "figures": figures}, indent=2) + "\n")
    if tmp is not None:
        tmp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
