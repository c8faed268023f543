"""Samples of webdataset .tar shards: img2dataset's webdataset output, or any tar of `<key>.<ext>` members.

Planning streams each tar once and keeps what is small: each sample's caption (`.txt`, else the `.json`'s
caption field), its `.json` fields (image id, original url, kept columns) and where its image member lies
(offset and size). The image bytes are read later, by byte range, by the shard that holds the sample
(pipeline.read_files), so a tar is never cut along shard boundaries or read twice for its images.

Image id: the `.json`'s id field when it has one (img2dataset's `save_additional_columns`), else the
sample's key. A sample with no image member is dropped as a malformed row. A tar cut short keeps every
sample before the cut; the sample whose image runs past the end is counted as unreadable when read.
"""
from __future__ import annotations

import tarfile
from typing import Dict, Iterator, List

import pyarrow as pa

from edje.pipeline.file_samples import IMAGE_EXTENSIONS, json_object, sample_table, split_member_name
from edje.pipeline.locator import RANGE
from edje.pipeline.reasons import MALFORMED_ROW
from edje.pipeline.storage import url_to_fs
from edje.pipeline.url_source import InputFile, Malformed, ReadOptions

READ_BLOCK = 1 << 22  # bytes per read of a streamed tar (S3: one ranged GET)


def is_tar(path: str) -> bool:
    """A webdataset shard by its name."""
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".tar") and not name.startswith((".", "_"))


def iter_samples(f: InputFile, opts: ReadOptions, malformed: Malformed) -> Iterator[pa.Table]:
    """The samples of one tar as a planning batch (pipeline.file_samples)."""
    wanted = [opts.image_col.lower()] if opts.image_col else list(IMAGE_EXTENSIONS)
    samples = scan_tar(f.path, malformed, wanted)
    if not samples:
        return
    ids, urls, captions, positions, lengths, drops = [], [], [], [], [], []
    keep: Dict[str, List] = {c: [] for c in opts.keep_columns}
    for key, members in samples.items():
        meta = json_object(members.get("json"))
        image = next((members[e] for e in wanted if e in members), None)
        caption = members.get("txt")
        if caption is None and isinstance(meta.get(opts.caption_col), str):
            caption = meta[opts.caption_col].encode("utf-8")
        ids.append(str(meta[opts.id_col]) if meta.get(opts.id_col) is not None else key)
        urls.append(str(meta[opts.url_col]) if meta.get(opts.url_col) else f"{f.path}#{key}")
        captions.append(caption)
        positions.append(image[0] if image else 0)
        lengths.append(image[1] if image else 0)
        drops.append(None if image else MALFORMED_ROW)
        for c in opts.keep_columns:
            keep[c].append(meta.get(c))
    yield sample_table(ids, urls, captions, [f.path] * len(ids), positions, lengths, [RANGE] * len(ids), keep, drops)


def scan_tar(path: str, malformed: Malformed, images=IMAGE_EXTENSIONS) -> Dict[str, Dict]:
    """{key: {extension: (offset, size) of an image member (one of `images`), or the bytes of a .txt / .json
    member}} in tar order."""
    samples: Dict[str, Dict] = {}
    fs, p = url_to_fs(path)
    with fs.open(p, "rb", block_size=READ_BLOCK) as fh:
        try:
            with tarfile.open(fileobj=fh, mode="r|") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    key, ext = split_member_name(member.name)
                    if key.rsplit("/", 1)[-1].startswith("__"):  # webdataset's own metadata members
                        continue
                    entry = samples.setdefault(key, {})
                    if ext in ("txt", "json"):
                        entry[ext] = tar.extractfile(member).read()
                    elif ext in images:
                        entry[ext] = (member.offset_data, member.size)
        except (tarfile.TarError, EOFError, OSError) as e:
            # A tar cut short: the samples before the cut stand (an image running past the end fails when
            # read); one that is no tar at all holds no sample to count, so the file itself is reported.
            if not samples:
                malformed.count += 1
                if len(malformed.examples) < 5:
                    malformed.examples.append(f"{path}: not a readable tar ({type(e).__name__}: {e})")
    return samples
