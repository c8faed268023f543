"""`edje compress` (raw tables -> adapter -> int8) against encoding the same images with the adapter, side by side.

    .venv/bin/python benchmarks/bench_compress.py --images 4096          # the shipped backbone and reranker
    .venv/bin/python benchmarks/bench_compress.py --images 32            # a quick check that it runs

Both sides start from what a user holds, on local disk: an image folder of the sample world (sidecar
captions) and the raw token tables made from it.
  setup (untimed): the encode job over the folder without an adapter -> raw tables (fp16, the default);
  images:   the encode job over the folder with --adapter --quant int8 (read, decode, backbone, adapter, codec);
  compress: the compress job over the raw tables (read, adapter, codec: no backbone, no decode).
Ray is started once, before the jobs, as a job submitted to a running cluster finds it. Prints each side's
pipeline seconds (after Ray is reached) and end-to-end seconds, rows per second, and the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from edje.schemas.shipped import DEFAULT_BACKBONE, DEFAULT_RERANKER, REPO_ROOT


def image_folder(workdir: Path, images: int, image_size: int) -> Path:
    """A sample world as a user's image folder: `<id>.jpg` beside `<id>.txt`."""
    from edje.sampleworld.world import WorldConfig, generate, url_rows

    folder = workdir / "folder"
    if folder.exists():
        return folder
    world = workdir / "world"
    generate(WorldConfig(seed=1, n_train=images, n_val=0, n_test=0, image_size=image_size), world)
    folder.mkdir()
    for r in url_rows(world, "http://x"):
        shutil.copy(world / r["url"][len("http://x/"):], folder / f"{r['image_id']}.jpg")
        (folder / f"{r['image_id']}.txt").write_text(r["caption"])
    return folder


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2048, help="images (default %(default)s)")
    p.add_argument("--adapter", default=str(REPO_ROOT / DEFAULT_RERANKER), help="EDJE checkpoint (default: the "
                   "shipped compressed reranker, over the default backbone)")
    p.add_argument("--batch-size", type=int, default=256, help="rows per model call, both sides (default %(default)s)")
    p.add_argument("--shard-size", type=int, default=1024, help="rows per shard / table (default %(default)s)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (default: all)")
    p.add_argument("--workdir", help="where the folder and tables go (default: a temporary folder, removed)")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)

    import ray

    from edje.model.backbone import VisionBackbone
    from edje.pipeline.compress_job import run_compress_job
    from edje.pipeline.job import run_encode_job
    from edje.schemas.compress_job import CompressJobConfig
    from edje.schemas.config import BackboneConfig
    from edje.schemas.encode_job import EncodeJobConfig
    from edje.schemas.weights import find_weights

    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="edje-bench-compress-")
    workdir = Path(args.workdir or tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    weights = find_weights(backbone=DEFAULT_BACKBONE)
    size = VisionBackbone.create(BackboneConfig(DEFAULT_BACKBONE, weights)).preprocess.size
    folder = image_folder(workdir, args.images, size)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        common = dict(input=str(folder), batch_size=args.batch_size, shard_size=args.shard_size)
        raw = run_encode_job(EncodeJobConfig(output=str(workdir / "raw"), pretrained=weights, **common))
        for out in ("from-images", "compressed"):
            shutil.rmtree(workdir / out, ignore_errors=True)
        t0 = time.time()
        images = run_encode_job(EncodeJobConfig(output=str(workdir / "from-images"), adapter=args.adapter,
                                                quant="int8", **common))
        t1 = time.time()
        compressed = run_compress_job(CompressJobConfig(tables=str(workdir / "raw" / "tables"), adapter=args.adapter,
                                                        output=str(workdir / "compressed"), quant="int8",
                                                        batch_size=args.batch_size))
        t2 = time.time()
    finally:
        ray.shutdown()
    rows = {"images": images["images_ok"], "compress": compressed["images_ok"]}
    seconds = {"images": images["run"]["seconds"], "compress": compressed["run"]["seconds"]}
    total = {"images": t1 - t0, "compress": t2 - t1}
    figures = {"images": args.images, "raw_rows": raw["images_ok"], "rows": rows, "pipeline_seconds": seconds,
               "end_to_end_seconds": {k: round(v, 3) for k, v in total.items()},
               "rows_per_second": {k: round(rows[k] / max(seconds[k], 1e-9), 1) for k in rows},
               "speedup_pipeline": round(seconds["images"] / max(seconds["compress"], 1e-9), 2),
               "speedup_end_to_end": round(total["images"] / max(total["compress"], 1e-9), 2)}
    print(f"{'':>10} {'rows':>7} {'pipeline s':>11} {'end-to-end s':>13} {'rows/s':>9}")
    for k, name in (("images", "images"), ("compress", "compress")):
        print(f"{name:>10} {rows[k]:>7} {seconds[k]:>11.2f} {total[k]:>13.2f} {figures['rows_per_second'][k]:>9.1f}")
    print(f"compress is {figures['speedup_pipeline']}x encoding from images (pipeline), "
          f"{figures['speedup_end_to_end']}x end to end")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
