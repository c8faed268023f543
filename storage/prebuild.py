"""The node-wide files of a corpus built ahead of serving: the token store's mapped columns (storage/table_cache.py)
and, optionally, the first stage's trained FAISS index (storage/embedding_index.py), per shard.

Serving builds both on a node's first start anyway; building them here takes that time out of the replicas' start-up.
It stands apart from table_cache because the index reads the table cache: the command over both sits above them.

    python -m edje.storage.prebuild TABLES... [--shards N] [--index-factory IVF1024,PQ32np]
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Optional, Sequence

from edje.schemas.token_table import expand_paths, read_metadata
from edje.storage.table_cache import TOKEN_COLUMNS, CacheConfig, open_tables


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Build the token store's (and optionally the first stage's) mapped files ahead of serving."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("tables", nargs="+", help="token tables, folders or globs (local)")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--columns", nargs="+", default=list(TOKEN_COLUMNS))
    p.add_argument("--index-factory", help="also train and save the first stage's FAISS index (e.g. IVF1024,PQ32)")
    p.add_argument("--index-search-params", default="", help="its search parameters for the recall printed (nprobe=16)")
    p.add_argument("--cache-dir")
    args = p.parse_args(argv)
    paths = expand_paths(args.tables)
    meta = read_metadata(paths[0])
    config = CacheConfig(root=args.cache_dir)
    for s in range(args.shards):
        started = time.time()
        tables = open_tables(paths, meta, args.columns, s, args.shards, config)
        out = dict(shard=s, folder=tables.folder, rows=len(tables.ids), seconds=round(time.time() - started, 1))
        if args.index_factory:
            from edje.storage.embedding_index import mapped_index  # faiss and torch: only when an index is asked for

            index, _ = mapped_index(paths, args.index_factory, args.index_search_params, s, args.shards, cache=config)
            out["index"] = index.build_info
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
