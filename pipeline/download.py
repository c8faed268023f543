"""Download one input shard with img2dataset into a webdataset shard, then read it back as rows.

img2dataset's shard worker (`Downloader.download_shard`) fetches the urls with its thread pool,
resizes with our `PilResizer` (model size, EXIF applied, odd modes normalised), and writes
`{shard}.tar` (webdataset), `{shard}.parquet` (one row per input row with status and
error_message, failures included) and `{shard}_stats.json` on the output filesystem. A download
is reused on a rerun only when our own `{shard}.done` marker exists: img2dataset writes its
stats file before we have checked the shard.

Why the worker and not the public `img2dataset.download()` (tried, img2dataset 1.47.0):
- its resizer is hard-wired to OpenCV (see PilResizer for what that gets wrong); the only way
  around it, `disable_all_reencoding=True`, stores the original files, so `_downloads` would hold
  full-size originals instead of model-size JPEGs;
- every call spawns a process pool and a logger process and installs a SIGINT handler in the
  caller, here a Ray worker: 6.1 s per 16-image shard inside a Ray task, against 0.04 s for the
  worker called directly (measured on the sample world over loopback);
- its `incremental_mode="overwrite"` deletes its own `_tmp` folder after creating it and then
  retries the missing shard file for minutes.
So the worker's constructor is an internal interface, and the version is pinned exactly in
pyproject.toml; `downloader_options` holds the one call's arguments, and a test binds them to
the installed Downloader's signature, so a version whose worker differs fails at once.
"""
from __future__ import annotations

import os
import tarfile
import tempfile
from dataclasses import dataclass
from typing import Dict, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from edje.pipeline import storage
from edje.pipeline.decode import OK, PilResizer
from edje.pipeline.plan import read_shard_input
from edje.pipeline.reasons import DOWNLOAD_ERROR, classify_download_error, split_reason

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # img2dataset imports albumentations, which phones home

OOM_SHARD_COUNT = 5  # shard file names are zero-padded to 5 digits, as img2dataset writes them


@dataclass(frozen=True)
class DownloadConfig:
    """How to fetch and store one shard."""

    downloads: str  # folder (any fsspec url) for the webdataset shards
    image_size: int
    resize_mode: str = "shortest"
    threads: int = 32
    timeout: float = 10.0
    retries: int = 1
    max_pixels: int = 89_478_485


def shard_name(shard_id: int) -> str:
    """Zero-padded shard file stem."""
    return f"{shard_id:0{OOM_SHARD_COUNT}d}"


def download_shard(shard_id: int, rows: pa.Table, cfg: DownloadConfig) -> dict:
    """Run img2dataset's worker over `rows` (image_id, url, caption); returns its stats."""
    from img2dataset.downloader import Downloader

    name = shard_name(shard_id)
    table = pa.table({"image_id": rows.column("image_id"), "source_url": rows.column("url"),
                      "url": pa.array([iri_to_uri(u) for u in rows.column("url").to_pylist()], pa.string()),
                      "caption": rows.column("caption"), "row": pa.array(range(rows.num_rows), pa.int32())})
    fs, root = storage.url_to_fs(cfg.downloads)
    fs.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edje-dl-") as tmp:
        shard_file = os.path.join(tmp, f"{name}.feather")  # the worker deletes it when done
        with pa.OSFile(shard_file, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        downloader = Downloader(**downloader_options(cfg, rows.num_rows))
        downloader.download_shard((shard_id, shard_file))
    samples = _read_parquet(storage.join(cfg.downloads, f"{name}.parquet"))
    if samples.num_rows != rows.num_rows:
        raise RuntimeError(f"img2dataset wrote {samples.num_rows} status rows for shard {name}, "
                           f"expected {rows.num_rows}")
    stats = storage.read_json(storage.join(cfg.downloads, f"{name}_stats.json")) or {}
    storage.write_json(storage.join(cfg.downloads, f"{name}.done"), stats)
    return stats


def downloader_options(cfg: DownloadConfig, rows: int) -> dict:
    """The arguments of img2dataset's shard worker for a shard of `rows` rows (see the module docstring)."""
    from img2dataset.writer import WebDatasetSampleWriter

    return dict(
        sample_writer_class=WebDatasetSampleWriter,
        resizer=PilResizer(cfg.image_size, cfg.resize_mode, cfg.max_pixels),
        thread_count=max(1, min(cfg.threads, rows)), save_caption=True, extract_exif=False,
        output_folder=cfg.downloads, column_list=["image_id", "source_url", "row", "caption", "url"],
        timeout=cfg.timeout, number_sample_per_shard=max(rows, 2), oom_shard_count=OOM_SHARD_COUNT,
        compute_hash=None, verify_hash_type=None, encode_format="jpg", retries=cfg.retries,
        user_agent_token=None, disallowed_header_directives=["noai", "noimageai", "noindex", "noimageindex"],
    )


def iri_to_uri(url: str) -> str:
    """Percent-encode what urllib cannot send (non-ASCII or spaces in path/query, IDN host); others unchanged."""
    if url.isascii() and " " not in url:
        return url
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = parts.netloc.replace(host, host.encode("idna").decode("ascii")) if not host.isascii() else parts.netloc
    safe = "/:@!$&'()*+,;=%~-._"
    return urlunsplit((parts.scheme, netloc, quote(parts.path, safe=safe), quote(parts.query, safe=safe + "?"),
                       quote(parts.fragment, safe=safe)))


def _read_parquet(url: str) -> pa.Table:
    fs, path = storage.url_to_fs(url)
    with fs.open(path, "rb") as f:
        return pq.read_table(f)


def read_downloaded(shard_id: int, cfg: DownloadConfig) -> Iterator[Dict]:
    """Rows of a downloaded shard: one per input row, image bytes for successes, a reason otherwise."""
    name = shard_name(shard_id)
    samples = _read_parquet(storage.join(cfg.downloads, f"{name}.parquet")).to_pylist()
    images: Dict[str, bytes] = {}
    fs, path = storage.url_to_fs(storage.join(cfg.downloads, f"{name}.tar"))
    with fs.open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".jpg"):
                images[member.name[: -len(".jpg")]] = tar.extractfile(member).read()
    for s in samples:
        status, detail, data = OK, "", None
        if s["status"] == "success":
            data = images.get(s["key"])
            if data is None:
                status, detail = DOWNLOAD_ERROR, f"sample {s['key']} missing from {name}.tar"
        elif s["status"] == "failed_to_resize":
            status, detail = split_reason(s["error_message"])
        else:
            status, detail = classify_download_error(s["error_message"]), s["error_message"] or ""
        yield {"shard": shard_id, "row": int(s["row"]), "image_id": s["image_id"], "url": s["source_url"],
               "caption": s["caption"], "status": status, "detail": detail, "jpg": data}


def download_rows(item: Dict, cfg: DownloadConfig) -> Iterator[Dict]:
    """Ray Data flat_map stage: download a shard (unless our marker says it is done), yield its rows."""
    shard_id = int(item["shard"])
    if not storage.exists(storage.join(cfg.downloads, f"{shard_name(shard_id)}.done")):
        download_shard(shard_id, read_shard_input(item["input"], int(item["row_group"])), cfg)
    yield from read_downloaded(shard_id, cfg)

