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

from edje.schemas.cli_options import add_options, from_args
from edje.schemas.compress_job import CompressJobConfig


def build_parser() -> argparse.ArgumentParser:
    """The command line: CompressJobConfig's options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p, CompressJobConfig)
    return p


def config_from_args(argv=None) -> CompressJobConfig:
    """Parse the command line into a CompressJobConfig."""
    return from_args(CompressJobConfig, build_parser().parse_args(argv))


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
