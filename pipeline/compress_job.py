"""The compress job: raw token tables + a trained adapter -> compressed tables, without the images.

One raw table is one shard: its compressed table is committed alone (pipeline.write.commit_shard), so a
rerun of the same command skips what is committed and redoes the rest. The output folder has the encode
job's layout (manifest.json, plan/, stats/, tables/, summary.json; pipeline.manifest, pipeline.summary).
Each table records its lineage (the raw table, the adapter and its hash) under the token table's lineage key;
columns the raw tables kept from their input come along with their types.
"""
from __future__ import annotations

import dataclasses
import hashlib
import sys
import time
from collections import Counter, defaultdict
from typing import Dict, List, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from edje.pipeline import storage
from edje.pipeline.compress import (
    CompressBatch,
    CompressSpec,
    check_adapter_fits,
    compressed_metadata,
    extra_columns,
    load_adapter,
    read_raw_rows,
)
from edje.pipeline.job import WRITER_CPUS, IncompleteJobError, RayConnection, gather_commits, remove_stale_parts
from edje.pipeline.manifest import (
    JobManifest,
    ManifestMismatchError,
    committed_shards,
    load_manifest,
    load_plan,
    save_manifest,
    save_run,
)
from edje.pipeline.summary import build_summary
from edje.pipeline.url_source import file_version
from edje.pipeline.write import CarriedColumns, commit_shard, write_parts
from edje.schemas.compress_job import CompressJobConfig
from edje.schemas.token_table import TableMetadata, expand_paths, read_metadata

READ_CPUS = 0.5  # the row-group reader beside the adapter actors


def run_compress_job(cfg: CompressJobConfig) -> Dict:
    """Run (or resume) the compress job; writes and returns summary.json's content."""
    env = storage.configure_s3_endpoint(cfg.s3_endpoint)
    output = storage.absolute(cfg.output)
    adapter_path = storage.absolute(cfg.adapter)
    t0 = time.time()
    paths = [storage.absolute(p) for p in expand_paths(cfg.tables)]
    raw = same_metadata(paths)
    adapter_cfg = check_adapter_fits(raw, adapter_path)
    _, adapter_hash = load_adapter(adapter_path)
    meta = compressed_metadata(raw, adapter_cfg, adapter_hash, cfg.quant, cfg.group_size, cfg.compute_dtype)
    manifest = plan_compress(output, paths, meta, adapter_path)
    paths = manifest.input  # the raw tables with rows, in shard order
    committed_before = committed_shards(output)
    rows = load_plan(output).column("rows").to_pylist()
    pending = [s for s in range(manifest.num_shards) if s not in committed_before]
    print(f"[compress] {len(paths)} raw tables, {manifest.rows_in} rows, {manifest.num_shards - len(pending)} "
          f"already committed, {len(pending)} to do", flush=True)
    spec = CompressSpec(adapter_path, raw, cfg.quant, cfg.group_size, cfg.torch_threads, cfg.compute_dtype)
    committed, errors = {}, []
    with RayConnection(cfg) as ray_conn:
        if pending:
            ray_conn.connect()
        t_pipeline = time.time()
        if pending:
            keep = tuple(manifest.read_options.get("keep_columns", ()))
            committed, errors = _compress_shards(cfg, output, spec, meta, paths, rows, pending, env, keep,
                                                 {"adapter": adapter_path, "adapter_hash": adapter_hash})
        seconds = time.time() - t_pipeline
    run = {"started_at": t0, "seconds": round(seconds, 3), "total_seconds": round(time.time() - t0, 3),
           "plan_seconds": 0.0, "shards_committed": sorted(committed),
           "images_encoded": sum(s["images_ok"] for s in committed.values()), "errors": errors}
    save_run(output, {k: run[k] for k in ("started_at", "seconds", "plan_seconds", "shards_committed", "errors")})
    summary = build_summary(output, manifest, run, committed_before | set(committed))
    summary["lineage"] = {"source_tables": paths, "adapter": adapter_path, "adapter_hash": adapter_hash}
    storage.write_json(storage.join(output, "summary.json"), summary)
    print(f"[compress] {summary['images_ok']} rows in {len(summary['tables'])} tables under "
          f"{storage.join(output, 'tables')}, {summary['images_per_second']} rows/s", flush=True)
    if not summary["complete"]:
        raise IncompleteJobError(f"{len(summary['pending_shards'])} tables not committed ({errors[:3]}); run the "
                                 f"same command again to finish them")
    return summary


def same_metadata(paths: List[str]) -> TableMetadata:
    """The raw tables' common metadata (every field equal, as one corpus must be); raises naming the first misfit."""
    first = read_metadata(paths[0])
    first.check(paths[0], kind="raw")
    if first.augment is not None:
        raise ValueError(f"{paths[0]} holds augmented ({first.augment}) training rows: serving tables never carry "
                         f"them; compress tables encoded without --augment")
    for p in paths[1:]:
        read_metadata(p).check(p, **dataclasses.asdict(first))
    return first


def plan_compress(output: str, paths: List[str], meta: TableMetadata, adapter: str) -> JobManifest:
    """The folder's manifest: one shard per raw table that has rows (a shard whose every image failed leaves an
    empty one), written once; a rerun must name the same tables unchanged."""
    records, rows, keep = [], [], None
    for p in paths:
        fs, fp = storage.url_to_fs(p)
        info = fs.info(fp)
        with fs.open(fp, "rb") as f:
            footer = pq.ParquetFile(f)
            n, extra = footer.metadata.num_rows, extra_columns(footer.schema_arrow)
        if keep is not None and extra != keep:
            raise ValueError(f"{p} keeps columns {list(extra)}, the tables before it {list(keep)}")
        keep = extra
        if n:
            records.append([p, info.get("size"), file_version(info)])
            rows.append(n)
    fingerprint = hashlib.sha256(repr(records).encode()).hexdigest()[:16]
    table_meta = dataclasses.asdict(meta)
    stored = load_manifest(output)
    if stored is not None:
        stored.check_model("compressed", table_meta)
        if stored.fingerprint != fingerprint:
            raise ManifestMismatchError(f"{output} holds tables compressed from other raw tables (or the raw tables "
                                        f"changed since); use a new --output")
        return stored
    shards = pa.table({"shard": pa.array(range(len(records)), pa.int64()), "rows": pa.array(rows, pa.int64()),
                       "digest": pa.array([hashlib.sha256(repr(r).encode()).hexdigest()[:16] for r in records])})
    manifest = JobManifest(input=[r[0] for r in records], kind="compressed", table_metadata=table_meta, shard_size=0,
                           shards_per_file=1, read_options={"fmt": "raw-tables", "keep_columns": list(keep or ())},
                           fingerprint=fingerprint,
                           rows_in=sum(rows), rows_kept=sum(rows), read_failed={}, read_examples={},
                           num_shards=len(records), plan_digest=fingerprint, has_ids=True,
                           encoder={"adapter": adapter, "adapter_hash": meta.adapter_hash})
    save_manifest(output, manifest, shards)
    return manifest


def _compress_shards(cfg: CompressJobConfig, output: str, spec: CompressSpec, meta: TableMetadata,
                     paths: List[str], rows: List[int], pending: List[int], env: Dict, keep: Tuple[str, ...],
                     lineage: Dict) -> Tuple[Dict[int, Dict], List[str]]:
    """One Ray Data pipeline over the pending raw tables; commits each compressed table once all its rows are in."""
    import ray

    renv = {"runtime_env": {"env_vars": env}} if env else {}
    remove_stale_parts(output, set(pending))
    gpus = cfg.gpus_per_worker
    if gpus is None:
        gpus = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    items = [{"shard": s, "path": paths[s]} for s in pending]
    ds = (
        ray.data.from_items(items, override_num_blocks=len(items))
        .map_batches(read_raw_rows, batch_size=1, batch_format="pyarrow", num_cpus=READ_CPUS, **renv)
        .map_batches(CompressBatch, fn_constructor_kwargs={"spec": spec},
                     compute=ray.data.ActorPoolStrategy(size=cfg.concurrency), batch_size=cfg.batch_size,
                     batch_format="pyarrow", num_gpus=gpus, num_cpus=cfg.cpus_per_worker, **renv)
        .map_batches(write_parts, fn_kwargs={"output": output}, batch_format="pyarrow", batch_size=None,
                     num_cpus=WRITER_CPUS, **renv)
    )
    commit = ray.remote(num_cpus=0, max_retries=3)(commit_shard)
    meta_json = meta.to_bytes().decode()
    parts, counts, futures, errors = defaultdict(list), Counter(), {}, []
    try:
        for rec in ds.iter_rows():
            sid = int(rec["shard"])
            parts[sid].append(rec["part"])
            counts[sid] += int(rec["rows"])
            if counts[sid] >= rows[sid] and sid not in futures:
                futures[sid] = commit.options(**renv).remote(
                    output, sid, list(parts[sid]), rows[sid], meta_json,
                    carry=CarriedColumns(paths[sid], None, keep) if keep else None,
                    lineage={**lineage, "source_table": paths[sid]})
    except Exception as e:
        errors.append(f"pipeline: {type(e).__name__}: {str(e)[:500]}")
        print(f"[compress] pipeline failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    return gather_commits(futures, errors, "table"), errors
