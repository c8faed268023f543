"""The one FAISS index class: inner-product search over row vectors with string ids.

The serving first stage, the miner, evaluation and the training sampler's neighbour clusters all
search through it. Vectors are L2-normalised embeddings, so inner product = cosine similarity.
Any `faiss.index_factory` description works ("Flat" exact; "IVF256,PQ16" and the like for large
corpora, trained on a seeded sample of the vectors given at construction, as autofaiss does), with
search-time parameters as `faiss.ParameterSpace` takes them ("nprobe=16"). `recall_vs_exact` says what an
approximate index loses against exact search of the same vectors.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence, Tuple

import faiss
import numpy as np
import torch

log = logging.getLogger(__name__)


class EmbeddingIndex:
    """FAISS inner-product index over row vectors with string ids (any faiss.index_factory description)."""

    def __init__(self, ids: Sequence[str], vectors: np.ndarray, factory: str = "Flat",
                 device: Optional[torch.device] = None, search_params: str = "", train_size: int = 262_144):
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids but vectors of shape {list(vectors.shape)}")
        self.ids = list(ids)
        self.index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
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

    def __len__(self) -> int:
        return self.index.ntotal

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Append rows (live images); trained indexes assign them to their existing lists."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids but {len(vectors)} vectors")
        start = len(self.ids)
        self.index.add(vectors)
        self.ids.extend(ids)
        if self.copy is not None:
            self.copy = np.concatenate([self.copy, vectors])
        if self._row is not None:
            for r, x in enumerate(ids, start):
                self._row.setdefault(x, r)

    def rows_of(self, ids: Sequence[str]) -> Tuple[np.ndarray, List[str]]:
        """Row of each id (-1 when unknown) and the unknown ids (in request order, unique)."""
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
        if self.copy is not None:
            return self.copy[rows], []
        return np.stack([self.index.reconstruct(int(r)) for r in rows]).astype(np.float32), []

    def search(self, queries: np.ndarray, k: int, exclude: Optional[Sequence[Optional[str]]] = None
               ) -> Tuple[np.ndarray, np.ndarray]:
        """(scores [B, k'], rows [B, k']) with k' = min(k, size); rows are -1 where the index has fewer hits.
        `exclude[b]`: an id never returned to query b (a query image among its own results)."""
        k = min(int(k), len(self))
        if exclude is None:
            return self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        drop, _ = self.rows_of(list(exclude))  # -1 (nothing to drop) for None and ids not in the index
        # One more hit than asked: the excluded row is at most one of them.
        scores, rows = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), min(k + 1, len(self)))
        gone = (rows == drop[:, None]) & (drop[:, None] >= 0)
        keep = np.argsort(gone, axis=1, kind="stable")[:, :k]  # kept hits first, in their order
        rows, scores = np.take_along_axis(rows, keep, 1), np.take_along_axis(scores, keep, 1)
        cut = np.take_along_axis(gone, keep, 1)  # only when the index holds k rows or fewer
        return scores, np.where(cut, -1, rows)

    def recall_vs_exact(self, k: int = 10, queries: Optional[np.ndarray] = None, n: int = 1000) -> float:
        """Mean share of the exact top k that this index returns (1.0 for "Flat"); queries default to a
        seeded sample of the stored vectors."""
        if self.copy is None:
            return 1.0
        if queries is None:
            queries = self.copy[np.random.default_rng(1).choice(len(self.copy), min(n, len(self.copy)), replace=False)]
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        k = min(k, len(self))
        exact = faiss.IndexFlatIP(self.copy.shape[1])
        exact.add(self.copy)
        _, want = exact.search(queries, k)
        _, got = self.index.search(queries, k)
        return float(np.mean([len(set(w) & set(g)) / k for w, g in zip(want.tolist(), got.tolist())]))

    def release_vectors(self) -> int:
        """Drop the kept copy of the vectors (an approximate index's memory is then its codes); stored vectors are
        read back from the codes from then on, approximately. Returns the bytes freed."""
        if self.copy is None:
            return 0
        try:
            faiss.extract_index_ivf(self.index).make_direct_map()  # IVF lists answer reconstruct(id) only with one
        except RuntimeError:  # not an IVF index: reconstruct works as it is
            pass
        freed, self.copy = int(self.copy.nbytes), None
        return freed

    def nbytes(self) -> int:
        """Bytes of the FAISS index itself (serialised), without the ids and the kept copy of the vectors."""
        index = self.index
        if hasattr(faiss, "GpuIndex") and isinstance(index, faiss.GpuIndex):
            index = faiss.index_gpu_to_cpu(index)
        return int(faiss.serialize_index(index).nbytes)

    @classmethod
    def exact(cls, vectors: np.ndarray) -> "EmbeddingIndex":
        """A flat (exact) index whose ids are the row numbers."""
        return cls([str(i) for i in range(len(vectors))], vectors)


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


