"""Karpathy annotations, under the name that evaluation/rerank_eval.py still imports.

The reader lives in schemas/annotations.py (training reads the same files); once rerank_eval imports it
from there, this module has no reader left and goes.
"""
from schemas.annotations import Annotations, load_annotations  # noqa: F401
