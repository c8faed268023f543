"""The one FAISS class with an approximate index: sampled training, search parameters, recall against exact
search, and serving from the codes once the kept copy is released."""
import faiss
import numpy as np

from edje.storage.embedding_index import EmbeddingIndex

faiss.omp_set_num_threads(1)  # OpenMP threads spinning on a shared 2-core machine cost more than they give


def clustered(n=4000, d=32, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, d))
    x = centres[rng.integers(0, 40, n)] + 0.3 * rng.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_flat_is_exact_and_ivf_pq_reports_what_it_loses():
    v = clustered()
    ids = [f"i{k}" for k in range(len(v))]
    flat = EmbeddingIndex(ids, v)
    assert flat.recall_vs_exact(10) == 1.0 and flat.release_vectors() == 0
    low = EmbeddingIndex(ids, v, "IVF64,PQ8", search_params="nprobe=1", train_size=2000)
    high = EmbeddingIndex(ids, v, "IVF64,PQ8", search_params="nprobe=64", train_size=2000)
    r_low, r_high = low.recall_vs_exact(10), high.recall_vs_exact(10)
    assert 0 < r_low < r_high <= 1.0  # more lists probed finds more of the exact top 10
    assert high.nbytes() < flat.nbytes() / 4  # 8 bytes of codes per vector instead of 128
    # the same seed samples the same training vectors: a rebuild answers the same
    again = EmbeddingIndex(ids, v, "IVF64,PQ8", search_params="nprobe=64", train_size=2000)
    assert np.array_equal(again.search(v[:20], 5)[1], high.search(v[:20], 5)[1])


def test_released_copy_serves_from_the_codes():
    v = clustered()
    ids = [f"i{k}" for k in range(len(v))]
    index = EmbeddingIndex(ids, v, "IVF64,PQ16", search_params="nprobe=16")
    before = index.search(v[:10], 5, exclude=ids[:10])
    assert index.release_vectors() == v.nbytes and index.copy is None
    got, missing = index.vectors(["i3", "i7"])
    assert not missing and np.all(np.sum(got * v[[3, 7]], axis=1) > 0.9)  # approximate, close
    assert np.array_equal(index.search(v[:10], 5, exclude=ids[:10])[1], before[1])
    index.add(["new"], v[:1])
    assert index.vectors(["new"])[0].shape == (1, v.shape[1]) and len(index) == len(v) + 1


def test_new_indexes_skip_polysemous_training_and_answer_alike():
    """No search here uses a Hamming pre-filter, so PQ codes are not trained for one (it cost 99 % of training)."""
    from edje.storage.embedding_index import new_index

    for factory in ("IVF16,PQ8", "PQ8"):
        index = new_index(32, factory)
        part = faiss.downcast_index(faiss.try_extract_index_ivf(index) or index)
        assert part.do_polysemous_training is False, factory
    assert faiss.downcast_index(faiss.extract_index_ivf(faiss.index_factory(32, "IVF16,PQ8"))).do_polysemous_training
    assert new_index(32, "Flat").ntotal == 0
