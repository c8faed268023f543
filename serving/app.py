"""Builds the Serve application graph from a ServeConfig (also the `import_path` of serve_config.yaml).

Graph: Ingress -> {TokenStoreServer, Reranker(-> TokenStoreServer), FirstStage, Miner(-> Reranker)}.
Without a checkpoint only the miner (embedding similarity) is served: what pretraining asks for
before any EDJE checkpoint exists.
"""
from __future__ import annotations

from typing import Any, Dict

from ray.serve import Application

from serving.config import ServeConfig
from serving.first_stage import FirstStage
from serving.ingress import Ingress
from serving.miner import Miner
from serving.reranker import Reranker
from serving.token_store import TokenStoreServer


def build(config: ServeConfig) -> Application:
    """The bound application for a ServeConfig (pass it to serve.run)."""
    threads = config.torch_threads or 1
    store = reranker = first_stage = miner = None
    if config.checkpoint is not None:
        store = TokenStoreServer.options(**config.token_store.options()).bind(list(config.token_tables), config.checkpoint)
        reranker = Reranker.options(**config.reranker.options()).bind(config, store)
        first_stage = FirstStage.options(**config.first_stage.options()).bind(
            list(config.token_tables), config.index_factory, config.backbone_pretrained, threads)
    if config.caption_sources:
        miner = Miner.options(**config.miner.options()).bind(
            list(config.image_tables), list(config.caption_sources), config.index_factory, config.backbone_pretrained,
            reranker, threads)
    return Ingress.options(**config.ingress.options()).bind(
        config, config.resolved_auth_token(), store, reranker, first_stage, miner)


def build_app(args: Dict[str, Any]) -> Application:
    """Application builder for `serve run` / Serve config files: `args` are ServeConfig fields."""
    return build(ServeConfig.from_dict(dict(args)))
