"""The batch a file input's lister yields at planning: one row per sample, in the columns a url list gives
(image_id, url, caption), plus where its image lies (pipeline.locator), the kept columns, and
pipeline.validate's DROP_COLUMN: why a row the input itself marks as unusable is dropped.

Values read from JSON (webdataset `.json` members, image-folder sidecars) have no declared types; a kept
column of them takes one fixed type per kind of value: numbers float64, booleans bool, strings string,
anything else its JSON text. A column that is null in a whole batch is float64, the common case
(LAION's similarity, punsafe, width, height).
"""
from __future__ import annotations

import hashlib
import json
from typing import Dict, List, Optional, Sequence

import pyarrow as pa

from edje.pipeline.locator import locator_arrays
from edje.pipeline.validate import DROP_COLUMN

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pnm")


def path_image_id(relative: str) -> str:
    """Stable image id of a sample known only by where it lies: 'p' + 19 hex digits of the path's sha1."""
    return "p" + hashlib.sha1(relative.encode("utf-8")).hexdigest()[:19]


def json_object(data: Optional[bytes]) -> Dict:
    """A sample's JSON sidecar as a dict; {} when absent, unparsable or not an object (its fields are optional)."""
    if not data:
        return {}
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def json_array(values: Sequence) -> pa.Array:
    """JSON values as one Arrow array of a fixed type per kind of value (see the module docstring)."""
    import json

    present = [v for v in values if v is not None]
    if all(isinstance(v, bool) for v in present) and present:
        return pa.array(values, pa.bool_())
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    if all(isinstance(v, str) for v in present):
        return pa.array(values, pa.string())
    return pa.array([None if v is None else v if isinstance(v, str) else json.dumps(v) for v in values], pa.string())


def sample_table(ids: List[str], urls: List[str], captions: List[Optional[bytes]], sources: List[str],
                 positions: List[int], lengths: List[int], kinds: List[str], keep: Dict[str, List],
                 drops: Optional[List[Optional[str]]] = None) -> pa.Table:
    """One planning batch of a file input; `keep` holds each kept column's JSON values."""
    columns = {"image_id": pa.array(ids, pa.string()), "url": pa.array(urls, pa.string()),
               "caption": pa.array(captions, pa.binary()),
               **locator_arrays(sources, positions, lengths, kinds)}
    for name, values in keep.items():
        columns[name] = json_array(values)
    columns[DROP_COLUMN] = pa.array(drops if drops is not None else [None] * len(ids), pa.string())
    return pa.table(columns)


def split_member_name(name: str) -> tuple[str, str]:
    """(key, extension) of a tar member's name the way webdataset groups them: the key is everything up to
    the first dot of the base name, the extension the rest, lower-cased."""
    from webdataset.tariterators import base_plus_ext

    key, ext = base_plus_ext(name)
    return (key, ext.lower()) if key is not None else (name, "")


def split_file_name(name: str) -> tuple[str, str]:
    """(key, extension) of a file in a folder: the key is the path without its last extension (a file name
    may hold other dots), the extension lower-cased."""
    head, slash, base = name.rpartition("/")
    stem, dot, ext = base.rpartition(".")
    if not dot or not stem:
        return name, ""
    return head + slash + stem, ext.lower()
