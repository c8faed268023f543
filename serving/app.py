"""Builds the Serve application graph from a ServeConfig (also the `import_path` of serve_config.yaml).

Graph: Ingress -> {Reranker (holds the token store), FirstStage, Miner(-> Reranker)}, one Reranker and one
FirstStage per shard, each with `replicas_per_shard` replicas. FirstStage and Miner are plain classes
(serving/first_stage.py, serving/miner.py) made deployments in serving/deployments.py (the first stage's with
its metrics); Reranker is a thin shell around serving/reranker_core.py. With shards, the miner rescores through
every shard's reranker (ShardedRerankers: each pair to the shard that owns its image). The ingress carries Serve's
admission options (max_ongoing_requests, max_queued_requests) and answers refused requests 503 with Retry-After.
Options given here (ServeConfig's DeploymentResources) are defaults: a Serve config file's `deployments:`
section overrides them, per deployment and option (serve_config.yaml sets replicas and resources there).
Without a checkpoint only the miner (embedding similarity) is served: what pretraining asks for
before any EDJE checkpoint exists.
"""
from __future__ import annotations

from typing import Any, Dict

from ray.serve import Application

from edje.model.ranking import read_ranking
from edje.serving.config import ServeConfig
from edje.serving.deployments import FirstStageDeployment, MinerDeployment
from edje.serving.ingress import Ingress
from edje.serving.reranker import Reranker
from edje.serving.shards import ShardedRerankers


def check_tables(config: ServeConfig) -> None:
    """Refuse, before deploying anything, token tables that the checkpoint cannot read (TableMismatchError)."""
    if config.checkpoint is None:
        return
    from edje.model.edje import read_checkpoint_config
    from edje.schemas.token_table import read_metadata
    from edje.storage.token_store import expected_from_checkpoint

    want = expected_from_checkpoint(read_checkpoint_config(config.checkpoint))
    for path in config.token_tables:  # metadata only: no token bytes are read here
        read_metadata(path).check(path, **want)


def check_models(config: ServeConfig) -> None:
    """Refuse, before deploying anything, a backbone the tables name (or a query tower the rule names) that cannot
    be had here (CheckpointNotFound: one line naming it and why). Nothing large is downloaded: each replica loads
    the weights itself, at the commit the tables record."""
    from edje.model.backbone_weights import resolve
    from edje.schemas.token_table import read_metadata

    seen = set()
    # Caption sources may be annotation JSON: the miner embeds them with the image tables' backbone, checked here.
    for paths in (config.token_tables, config.image_tables):
        if paths:
            backbone = read_metadata(paths[0]).first_stage_backbone(config.backbone_pretrained)
            if backbone not in seen:
                seen.add(backbone)
                resolve(backbone, fetch_weights=False)
    if config.checkpoint is not None:  # and the text towers the rule's queries are embedded by
        for tower in read_ranking(config.checkpoint).query_towers:
            resolve(tower.backbone_config(config.checkpoint), fetch_weights=False)


def build(config: ServeConfig) -> Application:
    """The bound application for a ServeConfig (pass it to serve.run); mismatched tables and backbones that cannot
    be had raise here."""
    check_tables(config)
    check_models(config)
    threads = config.torch_threads or 1
    rerankers, first_stages = [], []
    if config.checkpoint is not None:
        towers = read_ranking(config.checkpoint).query_towers  # the rule's cosine is the first stage's
        for s in range(config.shards):
            shard = config.for_shard(s)
            suffix = "" if config.shards == 1 else f"-{s}"  # one deployment per shard: Serve routes within it
            replicas = config.replicas_per_shard
            rerankers.append(Reranker.options(name=f"Reranker{suffix}", **config.reranker.options(replicas)).bind(shard))
            first_stages.append(FirstStageDeployment.options(
                name=f"FirstStage{suffix}", **config.first_stage.options(replicas)).bind(
                list(config.token_tables), config.index_factory, config.backbone_pretrained, threads, shard.live_dir,
                index_search_params=config.index_search_params, shard=s, num_shards=config.shards,
                query_towers=towers, checkpoint=config.checkpoint))
    # The miner rescores through the reranker that holds each pair's image: the one deployment, or the shard's.
    reranker = None if not rerankers else rerankers[0] if len(rerankers) == 1 else ShardedRerankers(rerankers)
    miner = None
    if config.caption_sources:
        miner = MinerDeployment.options(**config.miner.options()).bind(
            list(config.image_tables), list(config.caption_sources), config.index_factory, config.backbone_pretrained,
            reranker, threads)
    # Serve answers the requests beyond the ingress's max_queued_requests itself: 503 with this Retry-After.
    return Ingress.options(**config.ingress.options(), backpressure_config={"retry_after_s": config.retry_after_s}).bind(
        config, config.resolved_auth_token(), rerankers, first_stages, miner)


def build_app(args: Dict[str, Any]) -> Application:
    """Application builder for `serve run` / Serve config files: `args` are ServeConfig fields."""
    return build(ServeConfig.from_dict(dict(args)))
