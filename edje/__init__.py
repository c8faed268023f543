"""EDJE on Ray's Python API: `from edje import EDJEReranker`.

    reranker = EDJEReranker.from_pretrained("checkpoints/edje-c16-rel")
    reranker.rank("a red circle left of a blue square", ["a.png", "b.png"], top_k=1)
"""
from edje.reranker import EDJEReranker, UnknownDocument

__all__ = ["EDJEReranker", "UnknownDocument"]
