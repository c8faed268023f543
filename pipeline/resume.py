"""Reuse, check or make the plan of an output folder: the step every run takes before encoding.

A fresh folder is planned (pipeline.plan) and its manifest written. A folder with a manifest
is checked against the model first (cheap), then against the input: unchanged files (same
fingerprint) reuse the stored plan without reading the list; otherwise the list is re-planned
without writing anything and must give the same plan digest (ManifestMismatchError if not).
Needs no Ray and no model, so the scale benchmark runs exactly this code.
"""
from __future__ import annotations

from dataclasses import asdict, replace
from typing import Dict, Optional, Tuple

import pyarrow as pa

from edje.pipeline.input_source import expand, resolve_format
from edje.pipeline.manifest import JobManifest, load_manifest, load_plan, save_manifest
from edje.pipeline.plan import PlanConfig, plan_input
from edje.pipeline.url_source import ReadOptions, fingerprint
from edje.schemas.encode_job import EncodeJobConfig


def plan_job(cfg: EncodeJobConfig, output: str, input_spec, world_port: Optional[int], meta: Dict,
             encoder: Dict) -> Tuple[JobManifest, pa.Table]:
    """The folder's manifest and shard records: reused, re-planned and checked, or planned afresh."""
    opts = read_options(cfg, input_spec)
    files = expand(input_spec, opts)
    fp = fingerprint(files, opts)
    stored = load_manifest(output)
    if stored is not None:
        stored.check_model(meta["kind"], meta)  # before reading the list: a wrong model fails at once
        if stored.fingerprint == fp and stored.shard_size == cfg.shard_size:
            return stored, load_plan(output)  # the same files, unchanged: the plan stands, unread
    pcfg = PlanConfig(cfg.shard_size, stored.shards_per_file if stored else cfg.shards_per_file, scratch=cfg.scratch)
    plan = plan_input(files, opts, pcfg, None if stored else output)  # never overwrite another job's inputs
    manifest = JobManifest(
        input=[input_spec] if isinstance(input_spec, str) else list(input_spec),
        kind=meta["kind"], table_metadata=meta, shard_size=cfg.shard_size, shards_per_file=pcfg.shards_per_file,
        read_options=asdict(opts), fingerprint=fp, rows_in=plan.rows_in, rows_kept=plan.rows_kept,
        read_failed=plan.failed, read_examples=plan.examples, num_shards=plan.shards.num_rows,
        plan_digest=plan.digest, has_ids=plan.has_ids,
        encoder=encoder, world_port=world_port)
    print(f"[encode] planned {plan.rows_in} rows into {plan.shards.num_rows} shards ({plan.timings})", flush=True)
    if stored is not None:
        stored.check_plan(manifest, load_plan(output), plan.shards)
        return stored, plan.shards
    save_manifest(output, manifest, plan.shards)
    return manifest, plan.shards


def read_options(cfg: EncodeJobConfig, input_spec) -> ReadOptions:
    """How the input is read, its format resolved (pipeline.input_source.resolve_format)."""
    opts = ReadOptions(cfg.input_format, cfg.url_col, cfg.caption_col, cfg.id_col, keep_columns=cfg.keep_columns,
                       image_col=cfg.image_col, path_col=cfg.path_col)
    return replace(opts, fmt=resolve_format(input_spec, opts))
