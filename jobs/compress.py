"""Turn raw token tables into compressed ones through a trained adapter, on Ray Data: no backbone, no images.

    python jobs/compress.py --tables runs/raw/tables --adapter ckpt/ --quant int8 --output runs/c16-int8
    edje compress --tables s3://b/raw/tables --adapter s3://b/edje-c64 --output s3://b/c64-int8
    ray job submit --working-dir . -- python jobs/compress.py --tables ... --adapter ... --output ...

The raw tables are the encode job's output without --adapter (backbone tokens, the training input); the
result is what the encode job writes with --adapter (adapter output, quantized: the serving input), up to
the raw tables' fp16 storage of the backbone tokens. One raw table gives one compressed table; running the
same command again resumes. Each table records its lineage (raw table, adapter, adapter hash); columns the
raw tables kept from their input come along. `<output>/summary.json` holds the counts and speed.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from edje.schemas.compress_job import CompressJobConfig


def build_parser() -> argparse.ArgumentParser:
    """The command line; every option maps onto a CompressJobConfig field."""
    d = CompressJobConfig(tables="-", adapter="-", output="-")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", nargs="+", required=True, help="raw token tables: files, folders or globs on any "
                   "fsspec path (local, s3://), all made by one backbone")
    p.add_argument("--adapter", required=True, help="EDJE checkpoint dir whose adapter compresses the tokens; it "
                   "must have been trained on the tables' backbone")
    p.add_argument("--output", required=True, help="output folder on any fsspec path: tables/, stats/, "
                   "manifest.json, summary.json")
    p.add_argument("--quant", default=d.quant, choices=["fp32", "fp16", "int8", "int4"],
                   help="token storage (default %(default)s)")
    p.add_argument("--group-size", type=int, help="int4 only: values per scale (default: one scale per token)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="rows per adapter call (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="adapter actors (default %(default)s)")
    p.add_argument("--gpus-per-worker", type=float, help="GPUs per adapter actor (default: 1 when the cluster has "
                   "GPUs, else 0 = CPU)")
    p.add_argument("--cpus-per-worker", type=float, default=d.cpus_per_worker,
                   help="CPUs per adapter actor (default %(default)s)")
    p.add_argument("--torch-threads", type=int, default=d.torch_threads,
                   help="torch threads per adapter actor (default: its CPU count)")
    p.add_argument("--compute-dtype", default=d.compute_dtype, choices=["fp32", "bf16"],
                   help="the adapter's arithmetic on every device (default %(default)s)")
    p.add_argument("--s3-endpoint", help="S3-compatible endpoint url for s3:// paths (e.g. MinIO, moto)")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else start a local Ray)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray this command starts (default: all)")
    return p


def config_from_args(argv=None) -> CompressJobConfig:
    """Parse the command line into a CompressJobConfig."""
    args = vars(build_parser().parse_args(argv))
    return CompressJobConfig(**{**args, "tables": tuple(args["tables"])})


def main(argv=None) -> int:
    """Run the job; exit status 0 when every table is committed, 1 otherwise (rerun to finish), 2 when the tables
    and the adapter do not fit together or the output folder holds another job (one line says why)."""
    cfg = config_from_args(argv)
    from edje.pipeline.compress import AdapterMismatchError
    from edje.pipeline.compress_job import run_compress_job
    from edje.pipeline.job import IncompleteJobError
    from edje.pipeline.manifest import ManifestMismatchError
    from edje.schemas.token_table import TableMismatchError

    try:
        run_compress_job(cfg)
    except IncompleteJobError as e:
        print(f"[compress] incomplete: {e}", file=sys.stderr)
        return 1
    except (AdapterMismatchError, TableMismatchError, ManifestMismatchError) as e:
        print(f"[compress] {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
