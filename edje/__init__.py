"""EDJE on Ray's Python API, installed as `edje` (the folder edje/): `from edje import EDJEReranker`.

    reranker = EDJEReranker.from_pretrained("checkpoints/edje-c16-caprel")
    reranker.rank("a red circle left of a blue square", ["a.png", "b.png"], top_k=1)

The system's parts install under this one name, each from its own top-level folder (`edje.pipeline` is pipeline/,
`edje.model` is model/, ...: pyproject.toml's package-dir); the reranker loads on first use, so `import edje.schemas`
or `edje --help` does not pay for torch.
"""
from __future__ import annotations

__all__ = ["EDJEReranker", "UnknownDocument"]


def __getattr__(name: str):
    """The public API, imported when first asked for."""
    if name in __all__:
        from edje import reranker
        return getattr(reranker, name)
    raise AttributeError(f"module 'edje' has no attribute {name!r}")
