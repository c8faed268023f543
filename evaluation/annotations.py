"""Karpathy annotations, under the name that evaluation/rerank_eval.py, evaluation/tables.py,
benchmarks/mixed_modal.py and two tests still import.

The reader lives in schemas/annotations.py (training reads the same files); once those modules import it
from there, this module has no reader left and goes.
"""
from schemas.annotations import Annotations, load_annotations, load_images  # noqa: F401
