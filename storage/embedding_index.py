"""The one FAISS index class: inner-product search over row vectors with string ids.

The serving first stage, the miner, evaluation and the training sampler's neighbour clusters all
search through it. Vectors are L2-normalised embeddings, so inner product = cosine similarity.
Any `faiss.index_factory` description works ("Flat" exact; "IVF256,PQ16" and the like for large
corpora, trained on a seeded sample of the vectors given at construction, as autofaiss does), with
search-time parameters as `faiss.ParameterSpace` takes them ("nprobe=16"). `recall_vs_exact` says what an
approximate index loses against exact search of the same vectors.

`mapped_index` serves a large corpus without holding it: the embeddings come memory-mapped from the table cache
(storage/table_cache.py), the trained index is saved there once and read back with `faiss.IO_FLAG_MMAP` (as
clip-retrieval's `enable_faiss_memory_mapping`), so its inverted lists stay in the page cache, shared by every
replica of the node. Rows added later (live images) go to a small exact index beside it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from typing import Dict, List, Optional, Sequence, Tuple

import faiss
import numpy as np
import torch

from edje.schemas.token_table import TableMetadata, read_metadata
from edje.storage.table_cache import CacheConfig, ImageIds, locked, open_tables

log = logging.getLogger(__name__)


class EmbeddingIndex:
    """FAISS inner-product index over row vectors with string ids (any faiss.index_factory description)."""

    def __init__(self, ids: Sequence[str], vectors: np.ndarray, factory: str = "Flat",
                 device: Optional[torch.device] = None, search_params: str = "", train_size: int = 262_144):
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids but vectors of shape {list(vectors.shape)}")
        self.ids = list(ids)
        self.index = new_index(vectors.shape[1], factory)
        if not self.index.is_trained:
            # Coarse quantizers and PQ codebooks need a sample, not the corpus: a fixed seed keeps rebuilds equal.
            sample = vectors
            if len(vectors) > train_size:
                sample = vectors[np.sort(np.random.default_rng(0).choice(len(vectors), train_size, replace=False))]
            self.index.train(sample)
        if search_params:
            faiss.ParameterSpace().set_index_parameters(self.index, search_params)
        self.index = _on_gpu(self.index, device)
        self.index.add(vectors)
        # Rows are read back (a query image's own vector) from an exact flat index; any other index stores codes
        # or lists that cannot give the table's vector back exactly, so it keeps a copy.
        self.copy = None if factory == "Flat" else vectors.copy()
        self._row: Optional[Dict[str, int]] = None  # id -> first row, built when first asked (caption indexes never are)
        self.index_path: Optional[str] = None  # the saved index this one maps (None: built in RAM)
        self.live: Optional[faiss.Index] = None  # rows added to a mapped index (which is read-only)
        self.build_info: dict = {}

    @classmethod
    def mapped(cls, ids: ImageIds, vectors: np.ndarray, index_path: str, search_params: str = "",
               device: Optional[torch.device] = None) -> "EmbeddingIndex":
        """The index saved at `index_path` (`save_trained`) read with IO_FLAG_MMAP over row-aligned `vectors`
        (memory-mapped: image queries read their exact vector there; nothing is copied)."""
        self = cls.__new__(cls)
        self.ids, self.copy, self._row, self.index_path, self.live = ids, vectors, None, index_path, None
        index = faiss.read_index(index_path, faiss.IO_FLAG_MMAP)
        if index.ntotal != len(vectors) or len(ids) != len(vectors):
            raise ValueError(f"{index_path} holds {index.ntotal} rows but the table cache {len(vectors)}")
        if search_params:
            faiss.ParameterSpace().set_index_parameters(index, search_params)
        self.index = _on_gpu(index, device)
        saved = _read_json(index_path + ".json")
        self.build_info = {k: v for k, v in saved.items() if k not in ("recall_query_rows", "exact_top10")}
        recall = _recall_at_10(self, saved)
        if recall is not None:
            self.build_info.update(recall_at_10_vs_exact=round(recall, 4), search_params=search_params,
                                   recall_queries=len(saved["recall_query_rows"]))
        return self

    def __len__(self) -> int:
        return self.index.ntotal + (self.live.ntotal if self.live is not None else 0)

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Append rows (live images); trained indexes assign them to their existing lists, a mapped one (read-only)
        keeps them in an exact index beside it."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids but {len(vectors)} vectors")
        start = len(self.ids)
        if self.index_path is not None:
            if self.live is None:
                self.live = faiss.IndexFlatIP(vectors.shape[1])
            self.live.add(vectors)
            self.ids.extend(ids)
            return
        self.index.add(vectors)
        self.ids.extend(ids)
        if self.copy is not None:
            self.copy = np.concatenate([self.copy, vectors])
        if self._row is not None:
            for r, x in enumerate(ids, start):
                self._row.setdefault(x, r)

    def rows_of(self, ids: Sequence[str]) -> Tuple[np.ndarray, List[str]]:
        """Row of each id (-1 when unknown) and the unknown ids (in request order, unique)."""
        if isinstance(self.ids, ImageIds):  # sorted, mapped ids: a binary search, no dict of every id
            rows = self.ids.rows(list(ids))
            return rows, list(dict.fromkeys(x for x, r in zip(ids, rows) if r < 0))
        if self._row is None:
            row: Dict[str, int] = {}
            for r, x in enumerate(self.ids):
                row.setdefault(x, r)
            self._row = row
        rows = np.array([self._row.get(x, -1) for x in ids], dtype=np.int64)
        return rows, list(dict.fromkeys(x for x, r in zip(ids, rows) if r < 0))

    def vectors(self, ids: Sequence[str]) -> Tuple[Optional[np.ndarray], List[str]]:
        """The stored vectors [B, d] of the ids, or (None, the unknown ids)."""
        rows, missing = self.rows_of(ids)
        if missing:
            return None, missing
        if self.live is not None:  # a mapped index: its rows from the mapped vectors, added ones from beside it
            base = self.index.ntotal
            out = np.empty((len(rows), self.copy.shape[1]), np.float32)
            old = rows < base
            out[old] = self.copy[rows[old]]
            out[~old] = np.stack([self.live.reconstruct(int(r - base)) for r in rows[~old]]) if (~old).any() else 0
            return out, []
        if self.copy is not None:
            return np.asarray(self.copy[rows], np.float32), []
        return np.stack([self.index.reconstruct(int(r)) for r in rows]).astype(np.float32), []

    def search(self, queries: np.ndarray, k: int, exclude: Optional[Sequence[Optional[str]]] = None
               ) -> Tuple[np.ndarray, np.ndarray]:
        """(scores [B, k'], rows [B, k']) with k' = min(k, size); rows are -1 where the index has fewer hits.
        `exclude[b]`: an id never returned to query b (a query image among its own results)."""
        k = min(int(k), len(self))
        if exclude is None:
            return self._search(np.ascontiguousarray(queries, dtype=np.float32), k)
        drop, _ = self.rows_of(list(exclude))  # -1 (nothing to drop) for None and ids not in the index
        # One more hit than asked: the excluded row is at most one of them.
        scores, rows = self._search(np.ascontiguousarray(queries, dtype=np.float32), min(k + 1, len(self)))
        gone = (rows == drop[:, None]) & (drop[:, None] >= 0)
        keep = np.argsort(gone, axis=1, kind="stable")[:, :k]  # kept hits first, in their order
        rows, scores = np.take_along_axis(rows, keep, 1), np.take_along_axis(scores, keep, 1)
        cut = np.take_along_axis(gone, keep, 1)  # only when the index holds k rows or fewer
        return scores, np.where(cut, -1, rows)

    def _search(self, queries: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """The index's top k, merged with the rows added beside a mapped index (numbered after its rows)."""
        if self.live is None or not self.live.ntotal:
            return self.index.search(queries, min(k, self.index.ntotal))
        scores, rows = self.index.search(queries, min(k, self.index.ntotal))
        s2, r2 = self.live.search(queries, min(k, self.live.ntotal))
        return _top_k(np.concatenate([scores, s2], 1), np.concatenate([rows, np.where(r2 >= 0, r2 + self.index.ntotal, -1)], 1), k)

    def recall_vs_exact(self, k: int = 10, queries: Optional[np.ndarray] = None, n: int = 1000) -> float:
        """Mean share of the exact top k that this index returns (1.0 for "Flat"); queries default to a
        seeded sample of the stored vectors."""
        if self.copy is None:
            return 1.0
        if queries is None:
            queries = self.copy[np.random.default_rng(1).choice(len(self.copy), min(n, len(self.copy)), replace=False)]
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        k = min(k, self.index.ntotal)
        _, want = exact_search(self.copy[:self.index.ntotal], queries, k)
        _, got = self.index.search(queries, k)
        return float(np.mean([len(set(w) & set(g)) / k for w, g in zip(want.tolist(), got.tolist())]))

    def release_vectors(self) -> int:
        """Drop the kept copy of the vectors (an approximate index's memory is then its codes); stored vectors are
        read back from the codes from then on, approximately. Returns the bytes freed (0 when mapped: they are shared)."""
        if self.copy is None or self.index_path is not None:
            return 0
        try:
            faiss.extract_index_ivf(self.index).make_direct_map()  # IVF lists answer reconstruct(id) only with one
        except RuntimeError:  # not an IVF index: reconstruct works as it is
            pass
        freed, self.copy = int(self.copy.nbytes), None
        return freed

    def nbytes(self) -> int:
        """Bytes of the FAISS index itself (serialised), without the ids and the kept copy of the vectors."""
        if self.index_path is not None:
            return os.path.getsize(self.index_path)
        index = self.index
        if hasattr(faiss, "GpuIndex") and isinstance(index, faiss.GpuIndex):
            index = faiss.index_gpu_to_cpu(index)
        return int(faiss.serialize_index(index).nbytes)

    @classmethod
    def exact(cls, vectors: np.ndarray) -> "EmbeddingIndex":
        """A flat (exact) index whose ids are the row numbers."""
        return cls([str(i) for i in range(len(vectors))], vectors)


def _top_k(scores: np.ndarray, rows: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """The k best (score, row) per query of concatenated hit lists; empty slots (-1) last."""
    keyed = np.where(rows >= 0, scores, -np.inf)
    order = np.argsort(-keyed, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)


def exact_search(vectors: np.ndarray, queries: np.ndarray, k: int, chunk: int = 1_000_000
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top k over `vectors` (mapped or not), a chunk of rows at a time: memory stays flat."""
    best: Optional[Tuple[np.ndarray, np.ndarray]] = None
    for start in range(0, len(vectors), chunk):
        flat = faiss.IndexFlatIP(vectors.shape[1])
        flat.add(np.ascontiguousarray(vectors[start:start + chunk], dtype=np.float32))
        scores, rows = flat.search(queries, min(k, flat.ntotal))
        rows = np.where(rows >= 0, rows + start, -1)
        best = (scores, rows) if best is None else _top_k(np.concatenate([best[0], scores], 1),
                                                          np.concatenate([best[1], rows], 1), k)
    return best


def new_index(dim: int, factory: str) -> faiss.Index:
    """An untrained inner-product index from a faiss.index_factory description, without polysemous training."""
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    # faiss trains PQ codes for polysemous (Hamming-filtered) search by default, which no search here uses: it
    # reorders the codes, changes no distance, and took 99 % of training time (11.4 of 11.5 s for IVF64,PQ8 over
    # 2,000 vectors of 32 dims).
    for part in (index, faiss.try_extract_index_ivf(index)):
        part = faiss.downcast_index(part) if part is not None else None
        if hasattr(part, "do_polysemous_training"):
            part.do_polysemous_training = False
    return index


def save_trained(vectors: np.ndarray, factory: str, path: str, train_size: int = 262_144, add_rows: int = 262_144,
                 recall_queries: Optional[int] = None) -> dict:
    """Train an index on a seeded sample of `vectors`, add them a chunk at a time, measure recall@10 against exact
    search, and write it to `path` (a temporary name, then renamed) with a JSON of what was measured beside it.
    recall_queries: stored vectors used as queries (default 1,000, fewer beyond 1M rows: the exact search they
    need costs queries x rows)."""
    if recall_queries is None:
        recall_queries = int(min(1000, max(100, 10 ** 9 // max(1, len(vectors)))))
    started = time.time()
    vectors_n, dim = vectors.shape
    index = new_index(dim, factory)
    if not index.is_trained:  # the same seeded sample as EmbeddingIndex(): equal vectors give an equal index
        sample = np.arange(vectors_n)
        if vectors_n > train_size:
            sample = np.sort(np.random.default_rng(0).choice(vectors_n, train_size, replace=False))
        index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
    trained = time.time()
    for start in range(0, vectors_n, add_rows):
        index.add(np.ascontiguousarray(vectors[start:start + add_rows], dtype=np.float32))
    added = time.time()
    # Exact top 10 of some stored vectors, kept beside the index: whoever maps it measures recall under its own
    # search parameters (nprobe) with approximate searches only.
    query_rows = np.sort(np.random.default_rng(1).choice(vectors_n, min(recall_queries, vectors_n), replace=False))
    _, want = exact_search(vectors, np.ascontiguousarray(vectors[query_rows], dtype=np.float32), min(10, vectors_n))
    tmp = f"{path}.tmp-{os.getpid()}"
    faiss.write_index(index, tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    info = dict(factory=factory, rows=int(vectors_n), index_bytes=os.path.getsize(tmp),
                train_s=round(trained - started, 1), add_s=round(added - trained, 1),
                build_s=round(time.time() - started, 1), recall_query_rows=query_rows.tolist(),
                exact_top10=want.tolist())
    with open(path + ".json.tmp", "w") as f:
        json.dump(info, f)
    os.replace(path + ".json.tmp", path + ".json")
    os.replace(tmp, path)  # last: the index exists only once complete
    return info


def _recall_at_10(index: "EmbeddingIndex", saved: dict) -> Optional[float]:
    """recall@10 of the index, under its current search parameters, against the exact top 10 saved with it."""
    if not saved.get("recall_query_rows"):
        return None
    queries = np.ascontiguousarray(index.copy[np.asarray(saved["recall_query_rows"])], dtype=np.float32)
    want = saved["exact_top10"]
    k = len(want[0])
    _, got = index.index.search(queries, k)
    return float(np.mean([len(set(w) & set(g)) / k for w, g in zip(want, got.tolist())]))


def mapped_index(paths: Sequence[str], factory: str, search_params: str = "", shard: int = 0, num_shards: int = 1,
                 device: Optional[torch.device] = None, cache: CacheConfig = CacheConfig()
                 ) -> Tuple[EmbeddingIndex, TableMetadata]:
    """The first stage's index over local token tables of one backbone: embeddings memory-mapped from the table
    cache, the index trained and saved there once per (tables, shard, factory) and memory-mapped from then on."""
    first = read_metadata(paths[0])
    same = dict(backbone=first.backbone, pretrained=first.pretrained, feature_layer=first.feature_layer,
                embed_dim=first.embed_dim)
    for p in paths:
        read_metadata(p).check(p, **same)
    tables = open_tables(paths, first, ["image_embedding"], shard, num_shards, cache)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", factory)[:40] + "-" + hashlib.sha256(factory.encode()).hexdigest()[:8]
    path = os.path.join(tables.folder, f"faiss-{slug}.index")
    vectors = tables.columns["image_embedding"]
    if not os.path.exists(path):
        with locked(tables.folder):  # one builder per node; the other replicas map what it saved
            if not os.path.exists(path):
                save_trained(vectors, factory, path)
    return EmbeddingIndex.mapped(ImageIds(tables.ids), vectors, path, search_params, device), first


def _read_json(path: str) -> dict:
    """A small JSON file, or {} when there is none."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _on_gpu(index, device: Optional[torch.device]):
    """The index moved to the GPU when `device` is one and faiss was built with GPU support; else unchanged."""
    if device is None or torch.device(device).type != "cuda" or not hasattr(faiss, "StandardGpuResources"):
        return index
    try:
        if faiss.get_num_gpus() < 1:
            return index
        gpu = torch.device(device).index or 0
        return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), gpu, index)
    except Exception as e:
        log.warning("faiss index stays on the CPU: %s", e)
        return index


