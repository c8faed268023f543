"""The GPU smoke: every GPU-bound path of the project, one test per stage, on the device `--device` names.

    .venv/bin/pytest -q tests/test_gpu_smoke.py --device cuda      # on a GPU machine (cuda:N picks one)
    .venv/bin/pytest -q tests/test_gpu_smoke.py                    # the same stages on the CPU (the suite runs this)

No Ray needed: on a small sample world the stages drive the GPU-bound pieces in-process, in order, sharing one work
folder (a stage whose input an earlier stage should have left skips, naming that stage), with the shipped small
backbone (checkpoints/edje-tiny-convvit-sw.safetensors):

1. `encode_raw`: the encode actor class (pipeline/encode.py EncodeBatch) on the world's images, its output written and
   committed by the pipeline's own writer (pipeline/write.py) into raw fp16 tables, the stored tokens checked against
   a CPU fp32 reference within the fp16 codec's bound (tests/gpu_smoke_pieces.py states the bounds).
2. `train`: 20 optimizer steps through the Ray Train worker loop's own pieces (training/loop.py) on the device, over
   the raw table; the checkpoint the next stages use. `train_backbone`: two epochs of the small backbone's
   contrastive training (training/backbone.py, as jobs/train_backbone.py runs it) with `device=`.
3. `encode_int8`: EncodeBatch with that checkpoint's compression adapter into int8 tables, within the int8 codec's
   bound (half a step).
4. `evaluate`: evaluation/rerank_eval.py with `device=`, and its scores on the device against the CPU's.
5. `serve`: the Serve reranker's scorer (model/scoring.py PairScorer, as serving/reranker_core.py runs it) on the
   device at fp32 and at the served default precision ("auto") against evaluation's CPU fp32 scores; FirstStage and
   the miner built in-process with `device=`.

On the CPU the device-vs-CPU checks are exact. `--compute-dtype bf16` runs the encode actor in bf16 (its own, wider
slack). The same path through the jobs as subprocesses: tests/test_gpu_smoke_jobs.py (`--gpu-smoke-jobs`).
Throughput figures: benchmarks/bench_gpu_throughput.py.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gpu_smoke_pieces import SMALL_BERT, TRAIN_STEPS, assert_near_reference, encode_splits, encoder_spec, make_work

ROOT = Path(__file__).resolve().parent.parent
SERVED_FP32_TOL = 1e-4  # served fp32 logits vs evaluation's CPU fp32 logits
EVAL_DEVICE_TOL = 1e-4  # evaluation's logits on the device vs on the CPU


@pytest.fixture(scope="module")
def smoke(torch_device, request, tmp_path_factory):
    """The stages' shared work folder on the --device; torch's CPU threads as the sizes say, restored after."""
    import transformers

    threads, verbosity = torch.get_num_threads(), transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the random models' heads are newly initialised on purpose
    work = make_work(tmp_path_factory.mktemp("gpu-smoke"), torch_device, request.config.getoption("--compute-dtype"))
    torch.set_num_threads(work.threads)
    yield work
    torch.set_num_threads(threads)
    transformers.logging.set_verbosity(verbosity)


def test_encode_raw(smoke):
    actor, data, tables = encode_splits(smoke, encoder_spec(smoke, None, "fp16"), {0: "train", 1: "test"},
                                        smoke.root / "raw")
    smoke.raw_tables = tables  # written and committed: the next stages can run whatever the bound says
    details = [assert_near_reference(smoke, t, *data[sid]) for sid, t in zip((0, 1), tables)]
    print(f"encode-raw on {actor.encoder.device}: " + "; ".join(details))


def test_train(smoke):
    from edje.model.edje import save_checkpoint
    from edje.schemas.token_table import read_token_table, vector_matrix
    from edje.training.config import ModelSpec, TrainJobConfig
    from edje.training.loop import Position, build_optimizer, learning_rate, order_rows, planned_batches, step_inputs, train_step
    from edje.training.mining import MinerConfig
    from edje.training.model_init import build_model
    from edje.training.objectives import EDJEObjectives
    from edje.training.sampler import BatchPlanner

    raw_tables, device, steps = smoke.need("raw_tables", "test_encode_raw"), smoke.device, TRAIN_STEPS
    cfg = TrainJobConfig(tables=[raw_tables[0]], storage_path=str(smoke.root / "train"), name="smoke",
                         model=ModelSpec(adapter="compressed", num_queries=16, adapter_hidden=128, adapter_heads=4,
                                         bert_config=SMALL_BERT),
                         batch_size=8, k=2, warmup_steps=5, max_steps=steps, epochs=10 ** 6)
    table, meta = read_token_table(cfg.tables[0])
    table = order_rows(table)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, meta).to(device)
    objectives = EDJEObjectives(model, cfg.objectives, {k: float(v) for k, v in cfg.loss_weights})
    optimizer = build_optimizer(objectives, cfg)
    planner = BatchPlanner(table.column("image_id").to_pylist(), vector_matrix(table.column("image_embedding")),
                           cfg.batch_size, cfg.curriculum, cfg.seed * 7919)
    assert planner.batches_per_epoch >= 1, f"{planner.num_images} images: less than one batch"
    miner_cfg = MinerConfig(k=cfg.k, strategy=cfg.mining, temperature=cfg.mining_temperature)
    generator = torch.Generator().manual_seed(cfg.seed * 1000)
    before = {n: p.detach().clone() for n, p in objectives.named_parameters() if p.requires_grad}
    pos, rows = Position(), []
    while pos.step < steps:
        for i, raw in planned_batches(table, planner, planner.batches_per_epoch, pos):
            batch, neg, t_logits, _ = step_inputs(raw, meta, device, miner_cfg, generator)
            out = train_step(objectives, objectives, optimizer, batch, neg, learning_rate(cfg, pos.step, steps), t_logits)
            pos.step, pos.batch_in_epoch = pos.step + 1, i + 1
            rows.append({k: float(v.detach()) for k, v in out.items()})
            if pos.step >= steps:
                break
        else:
            pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0
    assert len(rows) == steps, f"{len(rows)} steps taken, {steps} asked"
    bad = [r for r in rows if not all(math.isfinite(v) for v in r.values())]
    assert not bad, f"non-finite losses: {bad[:2]}"
    devices = {p.device.type for p in objectives.parameters()}
    assert devices == {device.type}, f"parameters on {devices}"
    moved = sum(not torch.equal(before[n], p.detach()) for n, p in objectives.named_parameters() if n in before)
    assert moved > 0.9 * len(before), f"only {moved} of {len(before)} trained tensors changed"
    save_checkpoint(model.cpu(), str(smoke.root / "checkpoint"))
    smoke.checkpoint = str(smoke.root / "checkpoint")
    print(f"train: {steps} steps on {device}, loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, "
          f"{moved}/{len(before)} tensors updated")


def test_train_backbone(smoke):
    from safetensors.torch import load_file

    from edje.sampleworld.world import annotation_path
    from edje.schemas.shipped import DEFAULT_BACKBONE
    from edje.training.backbone import BackboneTrainConfig, train_backbone

    out, device = smoke.root / "backbone" / "smoke.safetensors", str(smoke.device)
    record = train_backbone(BackboneTrainConfig(
        train_annotations=str(annotation_path(smoke.world.root, "train")), output=str(out),
        eval_annotations=str(annotation_path(smoke.world.root, "test")), model=DEFAULT_BACKBONE, epochs=2,
        batch_size=16, warmup_steps=2, eval_every=2, device=device), log=lambda line: None)
    assert record["complete"] and record["config"]["device"] == device, f"record {record['config']}"
    state = load_file(str(out))
    assert all(bool(v.float().isfinite().all()) for v in state.values()), "non-finite backbone weights"
    print(f"train-backbone: {record['history'][-1]['step']} steps on {device}, loss {record['history'][-1]['loss']}, "
          f"zero-shot T2I R@1 {record['final_recall']['t2i']['r1']}")


def test_encode_int8(smoke):
    from edje.model.edje import load_checkpoint
    from edje.pipeline.encode import _load_adapter
    from edje.schemas.token_table import read_metadata

    checkpoint = smoke.need("checkpoint", "test_train")
    actor, data, tables = encode_splits(smoke, encoder_spec(smoke, checkpoint, "int8"), {1: "test"}, smoke.root / "int8")
    smoke.int8_table = tables[0]  # written and committed: evaluate and serve can run whatever the bound says
    meta = read_metadata(tables[0])
    assert meta.kind == "compressed" and meta.adapter_hash == load_checkpoint(checkpoint).adapter_hash(), \
        "compressed table's adapter hash differs from the checkpoint's"
    adapter = _load_adapter(checkpoint)[0]  # CPU fp32 reference adapter
    detail = assert_near_reference(smoke, tables[0], *data[1], adapter=adapter)
    print(f"encode-int8 on {actor.encoder.device}: {detail}")


def test_evaluate(smoke):
    from edje.evaluation.rerank_eval import EvalConfig, evaluate, score_pairs
    from edje.model.scoring import PairScorer
    from edje.sampleworld.world import annotation_path
    from edje.schemas.token_table import decode_tokens, read_token_table

    int8_table, checkpoint, device = smoke.need("int8_table", "test_encode_int8"), smoke.checkpoint, smoke.device
    out = smoke.root / "eval"
    cfg = EvalConfig(annotations=str(annotation_path(smoke.world.root, "test")), tokens=[int8_table], output=str(out),
                     checkpoint=checkpoint, k=5, examples=1, threads=smoke.threads, device=str(device))
    metrics = evaluate(cfg)
    run = json.loads((out / "run.json").read_text())
    assert torch.device(run["device"]).type == device.type, f"evaluation ran on {run['device']}"
    for d in ("t2i", "i2t"):
        for stage in ("first_stage", "reranked"):
            r = metrics[d][stage]
            assert 0 <= r["r1"] <= r["r5"] <= r["r10"] <= 100, f"{d} {stage} recall {r}"
    # The same scoring function on the device and on the CPU.
    table, meta = read_token_table(int8_table)
    tokens = torch.from_numpy(decode_tokens(table, meta))
    caps = table.column("caption").to_pylist() if "caption" in table.column_names else None
    texts = caps or [r.captions[1] for r in smoke.world.images if r.split == "test"][:len(tokens)]
    idx = np.arange(len(tokens))[::-1].copy()
    texts = [texts[i % len(texts)] for i in range(len(tokens))]
    on_cpu = score_pairs(PairScorer.from_checkpoint(checkpoint, "cpu", "fp32", 64), texts, idx, tokens)
    on_dev = score_pairs(PairScorer.from_checkpoint(checkpoint, device, "fp32", 64), texts, idx, tokens.to(device))
    diff = float(np.abs(on_cpu - on_dev).max())
    assert diff <= EVAL_DEVICE_TOL, f"evaluation logits on {device} differ from the CPU's by {diff:.3g}"
    print(f"evaluate on {run['device']}: T2I R@1 {metrics['t2i']['first_stage']['r1']} -> "
          f"{metrics['t2i']['reranked']['r1']}, logits vs CPU max diff {diff:.2g}")


def test_serve(smoke):
    from edje.model.edje import load_checkpoint, read_checkpoint_config
    from edje.model.scoring import PairScorer
    from edje.sampleworld.world import annotation_path
    from edje.serving.first_stage import FirstStage
    from edje.serving.miner import Miner
    from edje.serving.reranker_core import PairChunk, score_chunks
    from edje.storage.token_store import TokenStore

    int8_table, checkpoint, device = smoke.need("int8_table", "test_encode_int8"), smoke.checkpoint, smoke.device
    store = TokenStore.load([int8_table], read_checkpoint_config(checkpoint))
    recs = [r for r in smoke.world.images if r.split == "test"]
    ids = [r.image_id for r in recs]
    texts = [recs[(i + 1) % len(recs)].captions[0] if i % 2 else recs[i].captions[0] for i in range(len(recs))]
    got = store.gather_blobs(ids)
    assert not got.missing, f"token store lacks {got.missing[:3]}"
    reference = load_checkpoint(checkpoint).eval()  # evaluation's path: CPU, fp32
    with torch.inference_mode():
        ref = reference.encoder.score(texts, torch.from_numpy(store.codec.decode(got.blob, got.scales))).numpy()
    lines = []
    for precision in ("fp32", "auto"):
        scorer = PairScorer.from_checkpoint(checkpoint, device, precision)
        assert next(scorer.model.parameters()).device.type == device.type, f"scorer on {scorer.device}"
        chunks = [PairChunk(texts[sl], got.blob[sl], None if got.scales is None else got.scales[sl])
                  for sl in (slice(0, 5), slice(5, None))]
        logits = np.concatenate(score_chunks(scorer, store.meta, chunks))
        assert np.isfinite(logits).all(), f"{precision}: non-finite logits"
        diff = float(np.abs(logits - ref).max())
        if scorer.precision == "fp32":
            assert diff <= SERVED_FP32_TOL, f"served fp32 logits differ from evaluation's by {diff:.3g}"
        lines.append(f"{precision}={scorer.precision} max |served - evaluated| {diff:.2g}")
    fs = FirstStage([int8_table], torch_threads=smoke.threads, device=str(device))
    assert fs.backbone._mean.device.type == device.type, f"first-stage text tower on {fs.backbone._mean.device}"
    hits = fs.search(recs[0].captions[0], 5)
    assert len(hits) == 5 and all(h[0] in set(ids) for h in hits), f"first stage answered {hits}"
    miner = Miner([int8_table], [str(annotation_path(smoke.world.root, "test"))], torch_threads=smoke.threads,
                  device=str(device))
    assert miner.backbone._mean.device.type == device.type, f"miner text tower on {miner.backbone._mean.device}"
    mined = asyncio.run(miner.negatives(ids[:2], [recs[0].captions[0], "an unseen caption"], k=2))
    assert "negatives" in mined and all(len(n["negative_images"]) == 2 for n in mined["negatives"]), f"miner: {mined}"
    print(f"serve on {device}: " + "; ".join(lines))


def test_cuda_without_a_gpu_fails_at_setup(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    cmd = [sys.executable, "-m", "pytest", __file__, "--device", "cuda", "-k", "test_encode_raw", "-q",
           "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'inner'}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "ERROR at setup of test_encode_raw" in proc.stdout, text[-4000:]
    assert "--device cuda but no CUDA device is visible (use --device cpu" in proc.stdout, text[-4000:]
    assert "Traceback" not in proc.stdout, text[-4000:]


def test_device_rule():
    from edje.model.device import pick_device

    assert pick_device(None) == pick_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            pick_device("cuda")


def test_clis_take_a_device(capsys, tmp_path):
    from edje.evaluation.rerank_eval import EvalConfig
    from edje.jobs.evaluate import main as evaluate_main
    from edje.jobs.serve import config_from_args, parse
    from edje.jobs.train_backbone import main as train_backbone_main

    assert EvalConfig(annotations="a.json", tokens=["t"], output="o", backbone_only=True).device is None
    (tmp_path / "t.parquet").write_bytes(b"")
    cfg = config_from_args(parse(["--checkpoint", "c", "--tokens", str(tmp_path / "t.parquet"), "--first-stage-gpus", "1",
                                  "--miner-gpus", "0.5", "--reranker-gpus", "1"]))
    assert (cfg.first_stage.num_gpus, cfg.miner.num_gpus, cfg.reranker.num_gpus) == (1, 0.5, 1)
    # Replica counts are left to Serve (or a config file's `deployments:`) unless a flag sets them.
    assert cfg.first_stage.num_replicas is None and cfg.reranker.max_ongoing_requests == 256
    for main in (evaluate_main, train_backbone_main):
        with pytest.raises(SystemExit):
            main(["--help"])
        assert "--device" in capsys.readouterr().out
