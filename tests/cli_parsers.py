"""Each job's argparse parser, caught as the job builds it, and what its `--help` promises, as plain data.

`python tests/cli_parsers.py` rewrites tests/data/cli_options.json (every job's options) and
tests/data/cli_configs.json (the configs representative command lines give), only when a job's command line
changes on purpose; tests/test_cli_options.py compares against them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, List
from unittest import mock

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = Path(__file__).resolve().parent / "data" / "cli_options.json"
CONFIGS = Path(__file__).resolve().parent / "data" / "cli_configs.json"

# job -> its module; every job's main(argv) parses argv with one argparse parser before it starts anything.
JOBS: Dict[str, str] = {
    "serve": "edje.jobs.serve",
    "pretrain": "edje.jobs.pretrain",
    "finetune": "edje.jobs.finetune",
    "distill": "edje.jobs.distill",
    "quickstart": "edje.jobs.quickstart",
    "encode_cc12m": "edje.jobs.encode_cc12m",
    "compress": "edje.jobs.compress",
    "evaluate": "edje.jobs.evaluate",
    "train_backbone": "edje.jobs.train_backbone",
    "distill_text_tower": "edje.jobs.distill_text_tower",
}


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__("parser caught")
        self.parser = parser


def job_parser(job: str) -> argparse.ArgumentParser:
    """The parser `job`'s main builds, caught at its parse_args, so that nothing after parsing runs (no Ray)."""
    import importlib

    module = importlib.import_module(JOBS[job])

    def catch(self, args=None, namespace=None):
        raise _Caught(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch):
        try:
            module.main([])
        except _Caught as caught:
            return caught.parser
    raise AssertionError(f"{job}: main returned without parsing its arguments")


def _plain(value):
    """A default or choice as JSON: repository paths made relative (the snapshot is machine-independent)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return value.replace(str(ROOT), "<ROOT>")
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return repr(value)


def describe(parser: argparse.ArgumentParser) -> Dict[str, dict]:
    """Every option of the parser (by its first option string) with what --help and parsing make of it."""
    groups = {id(a): g.title for g in parser._action_groups for a in g._group_actions}
    out = {}
    for action in parser._actions:
        if not action.option_strings:
            continue
        out[action.option_strings[0]] = {
            "option_strings": list(action.option_strings),
            "action": type(action).__name__,
            "dest": action.dest,
            "nargs": action.nargs,
            "const": _plain(action.const),
            "default": _plain(action.default),
            "type": getattr(action.type, "__name__", None) if action.type is not None else None,
            "choices": _plain(list(action.choices)) if action.choices is not None else None,
            "required": action.required,
            "help": _plain(action.help),
            "metavar": _plain(action.metavar),
            "group": groups.get(id(action)),
        }
    return out


# Representative command lines per job: most options given once, and the defaults. Paths are relative to a folder
# made by job_configs (serve expands them) or absolute (training makes relative ones absolute).
ARGV: Dict[str, List[List[str]]] = {
    "serve": [
        ["--checkpoint", "ck", "--tokens", "t.parquet", "--captions", "cap.json", "--miner-images", "m.parquet",
         "--model-name", "m", "--max-documents", "7", "--live-dir", "live", "--image-url-hosts", "a.com", "b.com",
         "--ui", "--image-dir", "imgs", "--image-url-prefix", "http://x/{image_id}", "--image-url-allow", "loopback",
         "10.0.0.0/8", "--precision", "fp32", "--no-batching", "--max-batch-pairs", "9", "--torch-threads", "2",
         "--shards", "2", "--replicas-per-shard", "3", "--ingress-max-ongoing", "10", "--ingress-max-queued", "5",
         "--admit-in-flight", "4", "--retry-after", "2.5", "--index-factory", "IVF4,PQ2", "--index-search-params",
         "nprobe=2", "--reranker-replicas", "2", "--reranker-gpus", "0.5", "--reranker-cpus", "2",
         "--first-stage-gpus", "0.25", "--miner-gpus", "0.125", "--auth-token-env", "TOK", "--host", "0.0.0.0",
         "--port", "9000", "--name", "app", "--route-prefix", "/r/", "--address", "local", "--block",
         "--proxy-timeout", "30", "--start-attempts", "2", "--ready-timeout", "100"],
        ["--config", "serve.yaml", "--max-documents", "60", "--miner-gpus", "1", "--ui"],
        ["--config", "app.yaml", "--reranker-cpus", "3", "--ingress-max-queued", "7"],
        ["--config", "app.yaml"],
        ["--captions", "cap.json", "--miner-images", "m.parquet"],
    ],
    "pretrain": [
        ["--tables", "/t/a.parquet", "/t/b", "--storage-path", "/s", "--name", "n", "--export", "/e",
         "--num-workers", "3", "--use-gpu", "--cpus-per-worker", "2", "--batch-size", "8", "--epochs", "2",
         "--max-steps", "50", "--lr", "1e-4", "--weight-decay", "0.01", "--warmup-steps", "5", "--min-lr-ratio", "0.2",
         "--k", "3", "--mining", "sample", "--mining-temperature", "0.1", "--cluster-fraction", "0.5",
         "--cluster-start", "10", "--cluster-end", "20", "--cluster-size", "3",
         "--objectives", "itm", "mlm", "flip", "ground", "pointer", "--loss-weight", "mlm", "0.5",
         "--loss-weight", "flip", "2", "--flip-mode", "square", "--mirror-tables", "/m/a.parquet", "--pointer-k", "5",
         "--mlm-masking", "groups", "--mlm-groups", "/g.json", "--mlm-group-weight", "relation", "4",
         "--mlm-group-weight", "colour", "0.5", "--checkpoint-every", "7", "--log-every", "3",
         "--keep-checkpoints", "4", "--max-failures", "-1", "--seed", "9", "--adapter", "local",
         "--num-queries", "16", "--adapter-hidden", "64", "--adapter-heads", "2", "--adapter-position", "2d",
         "--adapter-position-gain", "0.5", "--language-model", "/lm", "--encoder-layers", "2",
         "--max-text-tokens", "32", "--word-context", "3", "--itm-input", "global",
         "--random-bert", "num_hidden_layers=2", "hidden_size=128", "--image-positions", "fixed", "--relation-roles",
         "--role-parse", "english", "--route-layer", "2", "--ground-layer", "3", "--pointer",
         "--grounding", "/g1.json", "/g2.json", "--init", "/init", "--ray-address", "ray://x:1"],
        ["--tables", "/t", "--storage-path", "rel/s", "--name", "n", "--negatives", "miner", "--miner-url", "http://m",
         "--batching", "stream", "--shuffle-buffer", "100", "--init-encoder-from", "/enc", "--teacher", "/teach",
         "--objectives", "itm", "distill"],
        ["--tables", "/t", "--storage-path", "/s", "--name", "n"],
    ],
    "finetune": [["--tables", "/t", "--storage-path", "/s", "--name", "n", "--init", "/init"]],
    "distill": [["--tables", "/t", "--storage-path", "/s", "--name", "n", "--teacher", "/teach"],
                ["--tables", "/t", "--storage-path", "/s", "--name", "n", "--teacher", "/teach", "--init", "/i"]],
    "quickstart": [
        ["--output", "o", "--world", "open", "--seed", "3", "--checkpoint", "ck", "--backbone-weights", "w", "--quant", "int4",
         "--k", "5", "--queries-per-image", "2", "--pretrain-steps", "4", "--test-images", "8", "--num-cpus", "3",
         "--keep-serving", "--port", "8123", "--same-side-rate", "0.5", "--train-world-seed", "none",
         "--train-world-n-train", "10", "--train-world-n-val", "2"],
        ["--train-world-seed", "7"],
        [],
    ],
    "encode_cc12m": [
        ["--output", "o", "--input", "a.tsv", "b.tsv", "--input-format", "tsv", "--url-col", "u", "--caption-col", "c",
         "--id-col", "i", "--keep-columns", "x, y", "--image-col", "img", "--path-col", "p", "--s3-endpoint",
         "http://s3", "--backbone", "edje-tiny-convvit", "--pretrained", "w.safetensors", "--feature-layer", "final",
         "--quant", "int4", "--group-size", "32", "--augment", "hflip", "--batch-size", "8", "--concurrency", "2",
         "--gpus-per-worker", "0.5", "--cpus-per-worker", "2", "--torch-threads", "3", "--compute-dtype", "bf16",
         "--shard-size", "100", "--address", "auto", "--num-cpus", "4", "--download-threads", "8", "--timeout", "5",
         "--retries", "2", "--max-image-pixels", "1000", "--world-dir", "wd", "--world-images", "64"],
        ["--output", "o", "--random-weights"],
        ["--output", "o", "--adapter", "ck"],
        ["--output", "o"],
    ],
    "compress": [
        ["--tables", "a", "b", "--adapter", "ck", "--output", "o", "--quant", "int4", "--group-size", "32",
         "--batch-size", "16", "--concurrency", "2", "--gpus-per-worker", "1", "--cpus-per-worker", "2",
         "--torch-threads", "2", "--compute-dtype", "bf16", "--s3-endpoint", "http://s3", "--address", "auto",
         "--num-cpus", "3"],
        ["--tables", "a", "--adapter", "ck", "--output", "o"],
    ],
    "evaluate": [
        ["--annotations", "a.json", "--tokens", "t1", "t2", "--checkpoint", "ck", "--k", "5", "--output", "o",
         "--add-first-stage-similarity", "0.3", "--quant", "int8",
         "--group-size", "16", "--backbone-pretrained", "w", "--batch-size", "8", "--max-queries-per-image", "2",
         "--held-out-template-queries", "1",
         "--examples", "1", "--threads", "2", "--device", "cpu", "--novel-against", "100",
         "--novel-against-n-train", "10", "--novel-against-n-val", "2", "--novel-against-held-out", "red+circle"],
        ["--annotations", "a.json", "--tokens", "t1", "--output", "o", "--backbone-only", "--fit-first-stage-weight",
         "--fit-calibration"],
        ["--compare", "spec.json", "--output", "o"],
    ],
    "train_backbone": [
        ["--train", "tr.json", "--eval", "ev.json", "--output", "o.safetensors", "--model", "m", "--epochs", "3",
         "--batch-size", "16", "--lr", "0.01", "--weight-decay", "0.2", "--warmup-steps", "5", "--seed", "4",
         "--eval-every", "2", "--stop-after", "1", "--neighbour-fraction", "0.25", "--cluster-size", "4",
         "--neighbour-start", "1", "--mask-same-words", "--world", "w.json", "--shape-caption-rate", "0.1",
         "--shape-caption-rate-end", "0.05", "--colour-caption-rate", "0.2", "--threads", "3", "--device", "cpu",
         "--storage-path", "s", "--name", "n", "--checkpoint-every", "11"],
        ["--train", "tr.json", "--output", "o.safetensors"],
    ],
    "distill_text_tower": [
        ["--teacher", "t.safetensors", "--train", "a.json", "b.json", "--output", "o.safetensors", "--model", "m",
         "--init", "i.safetensors", "--eval", "ev.json", "--epochs", "3", "--batch-size", "16", "--lr", "0.01",
         "--weight-decay", "0.2", "--warmup-steps", "5", "--seed", "4", "--eval-every", "2",
         "--unlocked-text-layers", "2", "--text-augment", "0.5", "--text-augment-ops", "punctuate", "--image-bank", "b.json",
         "--bank-weight", "0.5", "--device", "cpu",
         "--storage-path", "s", "--name", "n", "--checkpoint-every", "11", "--threads", "3"],
        ["--teacher", "t.safetensors", "--train", "a.json", "--output", "o.safetensors"],
    ],
}

# Files the command lines above name, made in a fresh folder: serve expands its paths and reads its --config.
FILES = {
    "t.parquet": "", "m.parquet": "", "cap.json": "[]",
    "serve.yaml": "checkpoint: ck\ntoken_tables: [t.parquet]\nmax_documents: 50\nreranker: {num_replicas: 2}\n"
                  "ingress: {max_ongoing_requests: 20}\nminer: {num_cpus: 2}\n",
    "app.yaml": "args:\n  checkpoint: ck\n  token_tables: t.parquet\n  ui: true\n  ingress: {max_ongoing_requests: 20}\n",
}


def _stop(record: dict, key: str):
    """A stand-in that records its arguments under `key` and ends the job there."""

    def stop(*args, **kwargs):
        record[key] = (args, kwargs)
        raise _Caught(None)

    return stop


def _keep(record: dict, key: str, result=None):
    """A stand-in that records its arguments under `key` and lets the job go on."""

    def keep(*args, **kwargs):
        record[key] = (args, kwargs)
        return result

    return keep


def job_config(job: str, argv: List[str]) -> str:
    """What `job`'s main would run with for `argv` (its configs and the options used beside them), as text; the
    work itself replaced by stand-ins that stop the job, so nothing starts. Run inside a folder holding FILES."""
    import importlib

    module = importlib.import_module(JOBS[job])
    record: dict = {}
    patches = {
        "serve": lambda: [mock.patch("edje.serving.app.check_models", _keep(record, "cfg")),
                          mock.patch("edje.serving.startup.init_ray", _keep(record, "init_ray")),
                          mock.patch("edje.serving.startup.start_serve", _stop(record, "start_serve"))],
        "quickstart": lambda: [mock.patch.object(module, "run", _stop(record, "run"))],
        "encode_cc12m": lambda: [mock.patch("edje.pipeline.job.run_encode_job", _stop(record, "run"))],
        "compress": lambda: [mock.patch("edje.pipeline.compress_job.run_compress_job", _stop(record, "run"))],
        "evaluate": lambda: [mock.patch("edje.evaluation.rerank_eval.evaluate", _stop(record, "run")),
                             mock.patch("edje.evaluation.compare.compare", _stop(record, "compare"))],
        "train_backbone": lambda: [mock.patch.object(module, "train_backbone", _stop(record, "run")),
                                   mock.patch.object(module.torch, "set_num_threads", _keep(record, "threads"))],
        "distill_text_tower": lambda: [mock.patch.object(module, "distill_text_tower", _stop(record, "run")),
                                       mock.patch.object(module.torch, "set_num_threads", _keep(record, "threads"))],
    }.get(job, lambda: [mock.patch("edje.training.launch._language_model_files", _keep(record, "cfg")),
                        mock.patch("ray.init", _stop(record, "ray_init"))])()
    for p in patches:
        p.start()
    try:
        module.main(list(argv))
    except _Caught:
        pass
    finally:
        for p in patches:
            p.stop()
    if "init_ray" in record:  # the hub's environment variables are this machine's: the address alone
        record["init_ray"] = record["init_ray"][0][:2]
    if "start_serve" in record:  # its first argument is a closure, printed with its address
        record["start_serve"] = record["start_serve"][0][1:]
    if "ray_init" in record:
        record["ray_init"] = record["ray_init"][1]["address"]
    return _plain(repr(dict(sorted(record.items()))))


def job_configs() -> Dict[str, List[str]]:
    """job_config of every command line in ARGV, made in a fresh folder holding FILES."""
    import tempfile

    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as folder:
        for name, text in FILES.items():
            Path(folder, name).write_text(text)
        os.chdir(folder)
        try:
            return {job: [job_config(job, argv) for argv in argvs] for job, argvs in ARGV.items()}
        finally:
            os.chdir(cwd)


def snapshot() -> Dict[str, dict]:
    """Every job's parser: its description, formatter and options, described."""
    out = {}
    for job in JOBS:
        parser = job_parser(job)
        out[job] = {"description": _plain(parser.description), "formatter": parser.formatter_class.__name__,
                    "options": describe(parser)}
    return out


if __name__ == "__main__":
    SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    CONFIGS.write_text(json.dumps(job_configs(), indent=1) + "\n")
    print(f"wrote {SNAPSHOT} and {CONFIGS}", file=sys.stderr)
