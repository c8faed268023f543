"""The token codec, under the name that evaluation/rerank_eval.py still imports.

The codec is the stored format of token tables and lives in schemas/codecs.py; once rerank_eval imports
it from there, this module has no reader left and goes.
"""
from schemas.codecs import TokenCodec  # noqa: F401
