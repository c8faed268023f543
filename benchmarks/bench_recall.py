"""Reranking-gain benchmark on the sample world's test split: backbone alone vs EDJE variants.

Runs each stage as the project's own commands (evaluation.tables, jobs/pretrain.py,
jobs/distill.py, jobs/evaluate.py), times it, and skips stages whose outputs exist (rerun to
resume). Prints a Markdown table of T2I / I2T R@1/5/10 and the wall time of every stage.

  python benchmarks/bench_recall.py --world /tmp/world --workdir runs/bench_recall --steps 300
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def stage(workdir: Path, name: str, cmd: list, done: Path, log) -> float:
    """Run one command unless `done` exists; returns (and records) its wall time."""
    times_path = workdir / "times.json"
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    if done.exists():
        log(f"[skip] {name}: {done} exists")
        return times.get(name, float("nan"))
    log(f"[run] {name}: {' '.join(map(str, cmd))}")
    t = time.time()
    with open(workdir / f"{name}.log", "w") as f:
        rc = subprocess.run([str(c) for c in cmd], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = round(time.time() - t, 1)
    if rc != 0:
        raise SystemExit(f"{name} failed (rc {rc}); see {workdir / (name + '.log')}")
    times[name] = wall
    times_path.write_text(json.dumps(times, indent=2))
    log(f"[done] {name} in {wall} s")
    return wall


def main(argv=None) -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", required=True, help="sample world folder (flickr30k_{train,test}.json, images/)")
    p.add_argument("--backbone", default="edje-tiny-convvit")
    p.add_argument("--pretrained", default="checkpoints/edje-tiny-convvit-sw.safetensors")
    p.add_argument("--workdir", default="runs/bench_recall")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps of each pretraining run")
    p.add_argument("--distill-steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--k-neg", type=int, default=3, help="hard negatives per sample and direction")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=20, help="short runs: the paper's 100 warm-up steps would be most of the run")
    p.add_argument("--mlm-weight", type=float, default=0.3, help="MLM loss weight (ITM and recovery weigh 1)")
    p.add_argument("--random-bert", nargs="*", default=["hidden_size=128", "num_hidden_layers=4",
                                                         "num_attention_heads=4", "intermediate_size=512"],
                   help="joint encoder shape (random init); pass no values to start from MiniLM")
    p.add_argument("--queries-per-image", type=int, default=1, help="T2I queries per test image (CPU budget)")
    p.add_argument("--test-annotations", help="evaluation split (default: <world>/flickr30k_test.json)")
    p.add_argument("--variants", nargs="+", default=["a", "b", "c", "d", "e", "f", "g"])
    p.add_argument("--ks", nargs="+", type=int, default=[5, 10, 20, 50])
    p.add_argument("--cpus", type=float, default=2.0, help="CPUs of the one training worker")
    p.add_argument("--c-steps", type=int, help="steps of the compressed pretraining runs (default --steps)")
    p.add_argument("--cluster-fraction", type=float, default=0.0,
                   help="final share of each batch drawn as near-neighbour clusters (training/sampler.py)")
    p.add_argument("--cluster-start", type=int, default=0)
    p.add_argument("--cluster-end", type=int, default=0)
    a = p.parse_args(argv)
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    log = lambda s: print(s, flush=True)
    world = Path(a.world)
    train_tab, test_tab = work / "tables" / "train.parquet", work / "tables_test" / "test.parquet"
    for split, out in (("train", train_tab), ("test", test_tab)):
        stage(work, f"tables_{split}", [PY, "-m", "edje.evaluation.tables", "--annotations", world / f"flickr30k_{split}.json",
                                        "--backbone", a.backbone, "--pretrained", a.pretrained, "--output", out], out, log)
    common = ["--tables", train_tab.parent, "--storage-path", work / "train", "--num-workers", "1",
              "--cpus-per-worker", a.cpus, "--batch-size", a.batch_size, "--k", a.k_neg, "--lr", a.lr,
              "--checkpoint-every", 100, "--log-every", 20, "--epochs", 1, "--warmup-steps", a.warmup_steps,
              "--loss-weight", "mlm", a.mlm_weight, "--cluster-fraction", a.cluster_fraction,
              "--cluster-start", a.cluster_start, "--cluster-end", a.cluster_end]
    if a.random_bert:
        common += ["--random-bert", *a.random_bert]
    ann = Path(a.test_annotations) if a.test_annotations else world / "flickr30k_test.json"

    def train(name: str, extra: list, job: str = "pretrain.py", steps: int = a.steps) -> Path:
        out = work / "ckpt" / name
        stage(work, f"train_{name}", [PY, ROOT / "jobs" / job, *common, "--name", name, "--max-steps", steps,
                                      "--export", out, *extra], out / "model.safetensors", log)
        return out

    def evaluate(name: str, ckpt, extra: list = ()) -> dict:
        out = work / "eval" / name
        cmd = [PY, ROOT / "jobs" / "evaluate.py", "--annotations", ann, "--tokens", test_tab, "--output", out,
               "--max-queries-per-image", a.queries_per_image, *extra]
        cmd += ["--backbone-only"] if ckpt is None else ["--checkpoint", ckpt]
        stage(work, f"eval_{name}", cmd, out / "metrics.json", log)
        return json.loads((out / "metrics.json").read_text())

    results = {}
    v = set(a.variants)
    if "a" in v:
        results["(a) backbone alone"] = evaluate("a_backbone", None)
    local = train("local", ["--adapter", "local", "--adapter-hidden", 1024]) if v & {"b", "d", "e", "f"} else None
    if "b" in v:
        results["(b) EDJE local"] = evaluate("b_local", local)
    if "c" in v:
        results["(c) compressed-64"] = evaluate("c_c64", train("c64", ["--adapter", "compressed", "--num-queries", 64,
                                                                      "--adapter-hidden", 1024], steps=a.c_steps or a.steps))
    if v & {"d", "e", "f"}:
        d64 = train("c64_distilled", ["--teacher", local, "--num-queries", 64, "--adapter-hidden", 1024],
                    job="distill.py", steps=a.distill_steps)
        results["(d) compressed-64 distilled"] = evaluate("d_c64_distilled", d64)
        if "e" in v:
            for q in ("int8", "int4"):
                results[f"(e) (d) {q} tokens"] = evaluate(f"e_{q}", d64, ["--quant", q])
        if "f" in v:
            for k in a.ks:
                if k != 10:
                    results[f"(f) (d) k={k}"] = evaluate(f"f_k{k}", d64, ["--k", k])
    if "g" in v:
        for m in (32, 128):
            results[f"(g) compressed-{m}"] = evaluate(f"g_c{m}", train(f"c{m}", ["--adapter", "compressed", "--num-queries", m,
                                                                                 "--adapter-hidden", 1024], steps=a.c_steps or a.steps))
    times = json.loads((work / "times.json").read_text()) if (work / "times.json").exists() else {}
    (work / "results.json").write_text(json.dumps({"results": results, "wall_s": times}, indent=2))
    lines = ["| variant | T2I R@1 | R@5 | R@10 | I2T R@1 | R@5 | R@10 |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, m in results.items():
        stage_key = "first_stage" if name.startswith("(a)") else "reranked"
        t, i = m["t2i"][stage_key], m["i2t"][stage_key]
        lines.append(f"| {name} | {t['r1']:.1f} | {t['r5']:.1f} | {t['r10']:.1f} | {i['r1']:.1f} | {i['r5']:.1f} | {i['r10']:.1f} |")
    print("\n".join(lines))
    print("\nwall times (s):", json.dumps(times, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
