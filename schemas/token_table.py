"""Parquet token tables: Arrow schema, table metadata, writer and checked reader.

A row's token matrix is one fixed-size binary blob plus one blob of fp16 scales (measured:
list columns are stored with repetition levels and read 10-50x slower for random access).
Rows are sorted by image id, row groups are small and the page index is on, so one id is a
cheap lookup. Every file carries `TableMetadata` under the schema key b"edje". Columns a user asked to keep
(the encode job's --keep-columns: LAION's similarity, punsafe, ...) follow the table's own, with their types;
readers select the columns they use. A table made from other tables (`edje compress`) records where it came
from under b"edje.lineage": provenance, not part of what a reader checks the table against.

A training table may also hold each image mirrored (the encode job's `--augment hflip`, recorded as the metadata's
`augment`): its own row, id `<image id>#hflip`, with `source_image_id` naming the image it mirrors and `augment`
naming the transform (both null on the images as they are). The caption and text embedding are the source row's,
as written: no longer true of the mirror where they say left or right, so training reads mirrored rows only as
the flip square's images, never as positives of their caption.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Literal, Optional, Sequence

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from edje.schemas.codecs import TokenCodec
from edje.schemas.config import BackboneConfig, CodecConfig

SCHEMA_VERSION = 1
METADATA_KEY = b"edje"
LINEAGE_KEY = b"edje.lineage"
# Every column a token table of either kind may have; columns kept from the input take other names.
TABLE_COLUMNS = ("image_id", "tokens", "token_scales", "image_embedding", "url", "caption", "text_embedding",
                 "source_image_id", "augment")
# Image transforms a training table may add as rows of their own, and the id suffix of each.
AUGMENTS = {"hflip": "#hflip"}
TableKind = Literal["raw", "compressed"]
ROW_GROUP_ROWS = 128


class TableMismatchError(ValueError):
    """A token table does not match the model that is about to consume it."""

    def __init__(self, field: str, found: Any, expected: Any, path: str = ""):
        self.field, self.found, self.expected = field, found, expected
        where = f" in {path}" if path else ""
        super().__init__(f"token table{where} does not match the model: {field} is {found!r}, expected {expected!r}")


@dataclass(frozen=True)
class TableMetadata:
    """What a token table holds and which model made it."""

    kind: TableKind  # "raw" = backbone tokens for training; "compressed" = adapter output for serving
    backbone: str
    pretrained: Optional[str]
    feature_layer: str
    num_tokens: int
    width: int
    quantization: str
    embed_dim: int  # width of the pooled image embedding (and of text embeddings)
    group_size: Optional[int] = None
    adapter_hash: Optional[str] = None  # None for raw tables
    schema_version: int = SCHEMA_VERSION
    # When the tokens come from another source than `backbone` (the sample world's perfect scene
    # tokens, a diagnostic), the open_clip model whose pooled image / text embeddings the table holds.
    embedding_backbone: Optional[str] = None
    embedding_pretrained: Optional[str] = None
    # The arithmetic that made the tokens ("fp32" or "bf16", whatever the device): `quantization` is
    # how they are stored, this is how they were computed (ARCHITECTURE.md, "Precision").
    compute_dtype: str = "fp32"
    # sha256 of the backbone's weights file (a local file, a tag's download, an hf-hub repository's weights): the
    # same name with other weights is refused.
    pretrained_sha256: Optional[str] = None
    # The hub commit the backbone was read from (an hf-hub repository, or a tag's weights on the hub).
    backbone_revision: Optional[str] = None
    backbone_random_weights: bool = False  # made by the architecture alone, randomly initialised
    # A key of AUGMENTS when the table also holds each image so transformed, as rows of their own (training only).
    augment: Optional[str] = None

    def __post_init__(self) -> None:
        if self.augment is not None and self.augment not in AUGMENTS:
            raise ValueError(f"augment must be one of {sorted(AUGMENTS)} or None, got {self.augment!r}")
        if self.augment is not None and self.kind != "raw":
            raise ValueError("only raw (training) tables hold augmented rows; serving tables never do")

    def backbone_config(self) -> BackboneConfig:
        """The backbone that made this table's tokens, as loaded: name, tag or file, revision, weights' sha256."""
        return BackboneConfig(self.backbone, self.pretrained, self.feature_layer, self.pretrained_sha256,
                              self.backbone_revision, self.backbone_random_weights)

    def first_stage_backbone(self, pretrained_override: Optional[str] = None) -> BackboneConfig:
        """The backbone that embeds queries against this table's image embeddings (the first stage)."""
        if self.embedding_backbone:
            return BackboneConfig(self.embedding_backbone, pretrained_override or self.embedding_pretrained)
        if pretrained_override:
            return BackboneConfig(self.backbone, pretrained_override, self.feature_layer, self.pretrained_sha256)
        return self.backbone_config()

    @property
    def codec(self) -> TokenCodec:
        """The codec that encodes this table's token blobs."""
        return TokenCodec(CodecConfig(self.quantization, self.group_size), self.num_tokens, self.width)

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "TableMetadata":
        data = json.loads(raw)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def check(self, path: str = "", **expected: Any) -> None:
        """Raise TableMismatchError naming the first field that differs from `expected`."""
        if self.schema_version != SCHEMA_VERSION:
            raise TableMismatchError("schema_version", self.schema_version, SCHEMA_VERSION, path)
        for name, want in expected.items():
            if not hasattr(self, name):
                raise KeyError(f"TableMetadata has no field {name!r}")
            if getattr(self, name) != want:
                raise TableMismatchError(name, getattr(self, name), want, path)


def table_schema(meta: TableMetadata, with_text: bool) -> pa.Schema:
    """Arrow schema of a token table; `with_text` adds caption + text embedding (training tables)."""
    codec = meta.codec
    fields = [
        pa.field("image_id", pa.string(), nullable=False),
        pa.field("tokens", pa.binary(codec.blob_bytes), nullable=False),
    ]
    if codec.num_scales:
        fields.append(pa.field("token_scales", pa.binary(2 * codec.num_scales), nullable=False))
    fields.append(pa.field("image_embedding", pa.list_(pa.float32(), meta.embed_dim), nullable=False))
    fields.append(pa.field("url", pa.string(), nullable=True))  # provenance; null when unknown
    if with_text:
        fields += [
            pa.field("caption", pa.string(), nullable=False),
            pa.field("text_embedding", pa.list_(pa.float32(), meta.embed_dim), nullable=False),
        ]
    if meta.augment is not None:
        fields += [pa.field("source_image_id", pa.string(), nullable=True), pa.field("augment", pa.string(), nullable=True)]
    return pa.schema(fields, metadata={METADATA_KEY: meta.to_bytes()})


def build_table(
    meta: TableMetadata,
    image_ids: Sequence[str],
    tokens: np.ndarray,
    image_embeddings: np.ndarray,
    captions: Optional[Sequence[str]] = None,
    text_embeddings: Optional[np.ndarray] = None,
    urls: Optional[Sequence[Optional[str]]] = None,
    sources: Optional[Sequence[Optional[str]]] = None,
) -> pa.Table:
    """Encode float token matrices [B, n, d] with the table's codec into an Arrow table."""
    blob, scales = meta.codec.encode(tokens)
    return build_table_from_blobs(meta, image_ids, blob, scales, image_embeddings, captions, text_embeddings, urls,
                                  sources)


def build_table_from_blobs(
    meta: TableMetadata,
    image_ids: Sequence[str],
    blob: np.ndarray,
    scales: Optional[np.ndarray],
    image_embeddings: np.ndarray,
    captions: Optional[Sequence[str]] = None,
    text_embeddings: Optional[np.ndarray] = None,
    urls: Optional[Sequence[Optional[str]]] = None,
    sources: Optional[Sequence[Optional[str]]] = None,
) -> pa.Table:
    """Assemble an Arrow token table from already-encoded blobs (uint8 [B, bytes]) and scales; `sources`: for
    a table with `meta.augment`, the image id each row transforms (None for an image as it is)."""
    with_text = captions is not None
    if with_text != (text_embeddings is not None):
        raise ValueError("captions and text_embeddings go together")
    b = len(image_ids)
    codec = meta.codec
    _check_rows("tokens", blob, (b, codec.blob_bytes))
    _check_rows("image_embedding", image_embeddings, (b, meta.embed_dim))
    columns: Dict[str, pa.Array] = {
        "image_id": pa.array(list(image_ids), pa.string()),
        "tokens": _fixed_binary(np.asarray(blob, np.uint8), codec.blob_bytes),
    }
    if codec.num_scales:
        if scales is None:
            raise ValueError(f"{meta.quantization} tables need token scales")
        sc = np.ascontiguousarray(np.asarray(scales, dtype="<f2"))
        _check_rows("token_scales", sc, (b, codec.num_scales))
        columns["token_scales"] = _fixed_binary(sc.view(np.uint8).reshape(b, 2 * codec.num_scales), 2 * codec.num_scales)
    columns["image_embedding"] = _fixed_list(image_embeddings, meta.embed_dim)
    if urls is not None and len(urls) != b:
        raise ValueError(f"urls has {len(urls)} rows, expected {b}")
    columns["url"] = pa.array(list(urls) if urls is not None else [None] * b, pa.string())
    if with_text:
        _check_rows("text_embedding", text_embeddings, (b, meta.embed_dim))
        if len(captions) != b:
            raise ValueError(f"captions has {len(captions)} rows, expected {b}")
        columns["caption"] = pa.array(list(captions), pa.string())
        columns["text_embedding"] = _fixed_list(text_embeddings, meta.embed_dim)
    if (sources is not None) != (meta.augment is not None):
        raise ValueError("source image ids go with (and only with) a table whose metadata names an augment")
    if sources is not None:
        if len(sources) != b:
            raise ValueError(f"sources has {len(sources)} rows, expected {b}")
        columns["source_image_id"] = pa.array(list(sources), pa.string())
        columns["augment"] = pa.array([None if s is None else meta.augment for s in sources], pa.string())
    return pa.Table.from_pydict(columns, schema=table_schema(meta, with_text))


def with_columns(table: pa.Table, extra: Optional[pa.Table]) -> pa.Table:
    """A token table with `extra`'s columns (row for row, types as they are) after its own."""
    if extra is None or extra.num_columns == 0:
        return table
    if extra.num_rows != table.num_rows:
        raise ValueError(f"kept columns have {extra.num_rows} rows, the table {table.num_rows}")
    clash = sorted(set(extra.column_names) & set(TABLE_COLUMNS))
    if clash:
        raise ValueError(f"kept columns {clash} would replace token table columns")
    for field in extra.schema:
        table = table.append_column(field, extra.column(field.name))
    return table


def with_lineage(table: pa.Table, lineage: Dict[str, Any]) -> pa.Table:
    """A token table that records where it came from (JSON under LINEAGE_KEY)."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          LINEAGE_KEY: json.dumps(lineage, sort_keys=True).encode()})


def read_lineage(path: str, filesystem: Optional[fsspec.AbstractFileSystem] = None) -> Optional[Dict[str, Any]]:
    """Where a token table came from, or None for one encoded from images."""
    fs, fs_path = _fs(path, filesystem)
    with fs.open(fs_path, "rb") as f:
        raw = (pq.read_schema(f).metadata or {}).get(LINEAGE_KEY)
    return json.loads(raw) if raw else None


def write_token_table(table: pa.Table, path: str, filesystem: Optional[fsspec.AbstractFileSystem] = None) -> int:
    """Sort by image id and write one Parquet file (small row groups, page index); returns bytes."""
    if METADATA_KEY not in (table.schema.metadata or {}):
        raise ValueError("token table has no EDJE metadata; build it with build_table()")
    table = table.sort_by("image_id")
    fs, fs_path = _fs(path, filesystem)
    with fs.open(fs_path, "wb") as f:
        pq.write_table(
            table, f, row_group_size=ROW_GROUP_ROWS, write_page_index=True,
            compression="zstd", use_dictionary=["image_id"],
        )
    return fs.size(fs_path)


def read_metadata(path: str, filesystem: Optional[fsspec.AbstractFileSystem] = None) -> TableMetadata:
    """Read only the EDJE metadata of a token table file."""
    fs, fs_path = _fs(path, filesystem)
    with fs.open(fs_path, "rb") as f:
        schema = pq.read_schema(f)
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise TableMismatchError("metadata", None, "EDJE token table metadata", path)
    return TableMetadata.from_bytes(raw)


def read_token_table(
    path: str,
    columns: Optional[List[str]] = None,
    filesystem: Optional[fsspec.AbstractFileSystem] = None,
    filters: Any = None,
    **expected: Any,
) -> tuple[pa.Table, TableMetadata]:
    """Read a token table after checking its metadata against `expected` field values."""
    meta = read_metadata(path, filesystem)
    meta.check(path, **expected)
    fs, fs_path = _fs(path, filesystem)
    with fs.open(fs_path, "rb") as f:
        table = pq.read_table(f, columns=columns, filters=filters)
    return table, meta


def read_token_tables(paths: Iterable[str], filesystem=None, columns=None, **expected: Any) -> tuple[pa.Table, TableMetadata]:
    """Read and concatenate several token tables that all match `expected` and each other."""
    tables, first = [], None
    for p in paths:
        if first is None:
            t, first = read_token_table(p, columns, filesystem, **expected)
        else:
            t, _ = read_token_table(p, columns, filesystem, **{**dataclasses.asdict(first), **expected})
        tables.append(t)
    if first is None:
        raise FileNotFoundError("no token tables given")
    return pa.concat_tables(tables).sort_by("image_id"), first


def expand_paths(paths: Iterable[str], suffix: str = ".parquet") -> List[str]:
    """Files named directly, every `suffix` file under a named folder, or glob matches; any fsspec path, sorted."""
    out: List[str] = []
    for p in paths:
        fs, root = fsspec.core.url_to_fs(p)
        proto = p.split("://", 1)[0] + "://" if "://" in p else ""
        if any(ch in p for ch in "*?["):
            found = sorted(fs.glob(root))
        elif fs.isdir(root):
            found = sorted(f for f in fs.find(root) if f.endswith(suffix))
        elif fs.exists(root):
            out.append(p)
            continue
        else:
            raise FileNotFoundError(f"{p} does not exist")
        if not found:
            raise FileNotFoundError(f"{p} matches no files" if "*" in p or "?" in p or "[" in p
                                    else f"no {suffix} files under {p}")
        out += [f if f.startswith(proto) else proto + f for f in found]
    return out


def decode_tokens(table: pa.Table, meta: TableMetadata) -> np.ndarray:
    """Decode a table's token blobs into float32 [N, n, d]."""
    blob = blob_matrix(table.column("tokens"), meta.codec.blob_bytes)
    scales = None
    if meta.codec.num_scales:
        scales = blob_matrix(table.column("token_scales"), 2 * meta.codec.num_scales).view("<f2")
    return meta.codec.decode(blob, scales)


def blob_matrix(column: pa.ChunkedArray | pa.Array, width: int) -> np.ndarray:
    """Zero-copy (when one chunk) view of a fixed-size binary column as uint8 [N, width]."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.offset:
        arr = pa.concat_arrays([arr])
    data = np.frombuffer(arr.buffers()[1], dtype=np.uint8, count=len(arr) * width)
    return data.reshape(len(arr), width)


def vector_matrix(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A fixed-size float list column as float32 [N, d]."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return np.asarray(pc.list_flatten(arr).to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(arr), -1)


def _fixed_binary(matrix: np.ndarray, width: int) -> pa.Array:
    flat = np.ascontiguousarray(matrix).reshape(-1)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(matrix), [None, pa.py_buffer(flat)])


def _fixed_list(matrix: np.ndarray, dim: int) -> pa.Array:
    flat = pa.array(np.ascontiguousarray(matrix, dtype=np.float32).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, dim)


def _check_rows(name: str, arr: np.ndarray, shape: tuple) -> None:
    if tuple(np.shape(arr)) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(np.shape(arr))}")


def _fs(path: str, filesystem: Optional[fsspec.AbstractFileSystem]):
    if filesystem is not None:
        return filesystem, path
    fs, fs_path = fsspec.core.url_to_fs(path)
    return fs, fs_path
