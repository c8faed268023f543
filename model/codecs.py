"""The token codec, under the name that model/token_encoder.py and evaluation/rerank_eval.py still import.

The codec is the stored format of token tables and lives in schemas/codecs.py; once those two modules
import it from there, this module has no reader left and goes.
"""
from schemas.codecs import TokenCodec  # noqa: F401
