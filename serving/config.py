"""Typed configuration of the serving application: what to load, limits, batching, resources."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal, Optional, Tuple

from edje.schemas.api import ApiLimits
from edje.serving.image_fetch import parse_allow

Precision = Literal["auto", "fp32", "bf16", "fp16"]


@dataclass(frozen=True)
class DeploymentResources:
    """Replicas and per-replica resources of one deployment: the code's options, which a Serve config file's
    `deployments:` section overrides (Serve applies the file's options over the code's, option by option)."""

    # None: not passed, so Serve's default (1) or the config file's `num_replicas` / `autoscaling_config` decides.
    num_replicas: Optional[int] = None
    num_cpus: float = 0.0
    num_gpus: float = 0.0
    max_ongoing_requests: int = 64  # requests a replica works on at once (Serve's own option)
    # Requests a caller (Serve's HTTP proxy for the ingress, a handle for the others) holds back while every replica
    # is at max_ongoing_requests; beyond it Serve refuses at once (HTTP 503 with Retry-After at the ingress).
    # None: not passed (Serve's default, -1: no limit, so an overload only grows the wait).
    max_queued_requests: Optional[int] = None
    # Serve's replica health check. Generous on purpose: a replica whose CPU is taken by training or
    # encoding beside it answers late, and being replaced then only adds a model load to the load.
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 120.0
    # A constructor that fails (bad path, mismatched table) fails the same way again: give up soon, say why.
    max_constructor_retry_count: int = 3

    def __post_init__(self) -> None:
        if self.health_check_period_s <= 0 or self.health_check_timeout_s <= 0:
            raise ValueError("health_check_period_s and health_check_timeout_s must be > 0")
        if self.num_replicas is not None and self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("num_cpus and num_gpus must be >= 0")
        if self.max_ongoing_requests < 1:
            raise ValueError(f"max_ongoing_requests must be >= 1, got {self.max_ongoing_requests}")
        # Serve compares the requests being routed (this one's predecessors) with the limit: 0 would refuse them all.
        if self.max_queued_requests is not None and self.max_queued_requests < 1 and self.max_queued_requests != -1:
            raise ValueError(f"max_queued_requests must be >= 1 (or -1: no limit), got {self.max_queued_requests}")

    def options(self, default_replicas: int = 1) -> dict:
        """Keyword arguments for `Deployment.options`: num_replicas when set (else `default_replicas` when it is not
        Serve's own default of 1, so that a config file's autoscaling still decides otherwise), max_queued_requests
        when set."""
        options = dict(max_ongoing_requests=self.max_ongoing_requests, health_check_period_s=self.health_check_period_s,
                       health_check_timeout_s=self.health_check_timeout_s,
                       max_constructor_retry_count=self.max_constructor_retry_count,
                       ray_actor_options={"num_cpus": self.num_cpus, "num_gpus": self.num_gpus})
        if self.num_replicas is not None:
            options["num_replicas"] = self.num_replicas
        elif default_replicas != 1:
            options["num_replicas"] = default_replicas
        if self.max_queued_requests is not None:
            options["max_queued_requests"] = self.max_queued_requests
        return options


@dataclass(frozen=True)
class ServeConfig:
    """Everything `edje.serving.app.build_app` needs; `checkpoint=None` serves the hard-negative miner alone."""

    checkpoint: Optional[str] = None  # EDJE checkpoint dir (any fsspec path)
    token_tables: Tuple[str, ...] = ()  # compressed token tables made with that checkpoint's adapter
    # Miner corpus. Images: token tables of any kind (image_id + image_embedding), default the served ones.
    # Captions: raw token tables (caption + text_embedding columns) or Karpathy-style annotation JSON files
    # (captions embedded by the backbone's text tower at start-up).
    miner_image_tables: Tuple[str, ...] = ()
    caption_sources: Tuple[str, ...] = ()
    backbone_pretrained: Optional[str] = None  # overrides the tables' pretrained tag/path for the text tower
    model_name: str = "edje"
    # Limits (422 beyond them).
    max_documents: int = 1000
    max_text_chars: int = 2000
    max_pairs: int = 1024  # pairs per /v1/negatives request
    max_top_k: int = 1000  # first-stage candidates per /v1/search
    # Reranker.
    dynamic_batching: bool = True
    max_batch_pairs: int = 256  # pairs per joint-encoder forward; larger requests are split
    batch_wait_timeout_s: float = 0.005
    precision: Precision = "auto"  # auto = fp32 on CPU, bf16 on GPU
    torch_threads: Optional[int] = None  # intra-op threads per CPU replica (None = the replica's num_cpus, >= 1)
    index_factory: str = "Flat"  # FAISS index description (exact inner product by default; "IVF1024,PQ32" for large corpora)
    index_search_params: str = ""  # faiss.ParameterSpace parameters of that index ("nprobe=32")
    # Shards (serving/shards.py): the corpus split by a hash of the image id; each shard is its own FirstStage and
    # Reranker deployment holding only its rows (and its live images, under live_dir/shard-<s>). 1 = one of each.
    shards: int = 1
    shard: int = 0  # the shard a replica serves (set per shard deployment by serving/app.py)
    # Replicas of each shard's FirstStage and Reranker (Serve's num_replicas; a deployment's own num_replicas, e.g.
    # --reranker-replicas, wins): a shard answers while one of its replicas does, and the ingress retries a call
    # whose replica died mid-request once, on another replica.
    replicas_per_shard: int = 1
    # Live images (POST /v1/images, image documents; serving/live_images.py). live_dir: the shared append log
    # that every replica applies and that persists added images as token tables (None: no /v1/images route).
    live_dir: Optional[str] = None
    max_image_bytes: int = 10_000_000  # encoded image size (413 beyond); base64 text is 4/3 of it
    max_image_pixels: int = 40_000_000  # decoded width x height (decompression bombs: 413)
    max_image_documents: int = 16  # inline images per rerank request (each is fetched and encoded)
    image_fetch_timeout_s: float = 10.0  # per url
    image_url_hosts: Optional[Tuple[str, ...]] = None  # hosts image urls may name (redirects included); None = any
    # Non-public addresses image urls may reach: CIDRs or addresses ("127.0.0.1/32"), "loopback", or host names.
    # None = public addresses only: loopback, private, link-local (cloud metadata) and the like are refused (422).
    image_url_allow: Optional[Tuple[str, ...]] = None
    image_cache_size: int = 1024  # encoded inline images kept per reranker replica (by content hash)
    # Search page (GET /ui, serving/search_page.py) and thumbnails (GET /v1/images/{id}/thumbnail,
    # serving/thumbnails.py; the route exists with the page or with an image source). Token tables hold no
    # pixels: image_dir is a local folder of <id>[.jpg|.jpeg|.png|.webp] files, image_url_prefix a url the id is
    # appended to (or put in place of "{image_id}"); without either, the corpus's stored url is fetched.
    ui: bool = False
    image_dir: Optional[str] = None
    image_url_prefix: Optional[str] = None
    auth_token: Optional[str] = None  # bearer token; None = no auth (or taken from env auth_token_env)
    auth_token_env: Optional[str] = "EDJE_API_TOKEN"
    ready_timeout_s: float = 5.0  # GET /readyz: how long each deployment may take to answer its probe (else 503)
    # max_ongoing_requests >= max_batch_pairs, so that small requests can fill a batch at one replica.
    reranker: DeploymentResources = DeploymentResources(num_cpus=1.0, max_ongoing_requests=256)
    first_stage: DeploymentResources = DeploymentResources()
    miner: DeploymentResources = DeploymentResources()
    # Admission (overload): an ingress replica works on max_ongoing_requests requests at once and Serve's proxy
    # holds max_queued_requests more; any request beyond them gets 503 with Retry-After at once instead of
    # waiting. An admitted request waits about (ongoing + queued) / throughput at worst: size the two to the
    # rate the deployments sustain times the latency a client accepts (benchmarks/bench_shards.py --phases overload).
    ingress: DeploymentResources = DeploymentResources(max_ongoing_requests=64, max_queued_requests=64)
    # Or a gate with no queue: an ingress replica works on at most this many requests (health, readiness and the
    # API description aside) and answers every further one 503 with Retry-After at once, so an admitted request
    # never waits behind others; Serve's queue cannot do that (max_queued_requests is -1 or >= 1). The ingress's
    # max_ongoing_requests must exceed it, so that Serve hands the excess to the gate. None: Serve's limits alone.
    admit_in_flight: Optional[int] = None
    retry_after_s: float = 1.0  # the Retry-After header (seconds, rounded up) of every 503: overload, a lost replica

    def __post_init__(self) -> None:
        if self.image_url_hosts is not None:
            object.__setattr__(self, "image_url_hosts", tuple(self.image_url_hosts))
        if self.image_url_allow is not None:
            allow = (self.image_url_allow,) if isinstance(self.image_url_allow, str) else tuple(self.image_url_allow)
            parse_allow(allow)  # a malformed entry fails here, at start-up, not at the first fetch
            object.__setattr__(self, "image_url_allow", allow)
        if self.image_url_prefix is not None and not self.image_url_prefix.startswith(("http://", "https://")):
            raise ValueError(f"image_url_prefix must be an http(s) url, got {self.image_url_prefix!r}")
        for name in ("token_tables", "miner_image_tables", "caption_sources"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(value))
        if self.checkpoint is not None and not self.token_tables:
            raise ValueError("a checkpoint is served over token tables: token_tables is empty")
        if self.checkpoint is None and not (self.miner_image_tables and self.caption_sources):
            raise ValueError("without a checkpoint only the miner is served: it needs miner_image_tables and caption_sources")
        if self.shards < 1 or not 0 <= self.shard < self.shards:
            raise ValueError(f"shards must be >= 1 and 0 <= shard < shards, got shards={self.shards}, shard={self.shard}")
        if self.ready_timeout_s <= 0:
            raise ValueError(f"ready_timeout_s must be > 0, got {self.ready_timeout_s}")
        if self.replicas_per_shard < 1:
            raise ValueError(f"replicas_per_shard must be >= 1, got {self.replicas_per_shard}")
        if self.admit_in_flight is not None and not 1 <= self.admit_in_flight < self.ingress.max_ongoing_requests:
            raise ValueError(f"admit_in_flight must be >= 1 and below the ingress's max_ongoing_requests "
                             f"({self.ingress.max_ongoing_requests}), got {self.admit_in_flight}")
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s}")
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be auto, fp32, bf16 or fp16, got {self.precision!r}")
        for name in ("max_documents", "max_text_chars", "max_pairs", "max_top_k", "max_batch_pairs", "max_image_bytes",
                     "max_image_pixels", "max_image_documents", "image_cache_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def image_tables(self) -> Tuple[str, ...]:
        """The miner's image corpus: its own tables, else the served token tables."""
        return self.miner_image_tables or self.token_tables

    def resolved_auth_token(self) -> Optional[str]:
        """The bearer token: the configured one, else the env variable's value, else None (no auth)."""
        if self.auth_token:
            return self.auth_token
        if self.auth_token_env:
            return os.environ.get(self.auth_token_env) or None
        return None

    def api_limits(self) -> ApiLimits:
        """The request limits: the ingress validates with them and its OpenAPI schema states them."""
        return ApiLimits(max_documents=self.max_documents, max_text_chars=self.max_text_chars, max_pairs=self.max_pairs,
                         max_top_k=self.max_top_k, can_rescore=self.checkpoint is not None,
                         max_image_bytes=self.max_image_bytes, max_image_pixels=self.max_image_pixels,
                         max_image_documents=self.max_image_documents)

    def limits(self) -> dict:
        """The request limits, as reported by GET /v1/info."""
        return {**dataclasses.asdict(self.api_limits()), "max_batch_pairs": self.max_batch_pairs}

    @classmethod
    def from_dict(cls, data: dict) -> "ServeConfig":
        """Build from a plain dict (a Serve config's `args`), rejecting unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"ServeConfig: unknown fields {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("reranker", "first_stage", "miner", "ingress") and isinstance(value, dict):
                value = DeploymentResources(**value)
            elif key in ("token_tables", "miner_image_tables", "caption_sources") and value is not None:
                value = (value,) if isinstance(value, str) else tuple(value)
            kwargs[key] = value
        return cls(**kwargs)

    def for_shard(self, shard: int) -> "ServeConfig":
        """The config one shard's deployments run with: its shard number and its own live folder."""
        return self.replace(shard=shard, live_dir=self.live_dir_of_shard(shard))

    def live_dir_of_shard(self, shard: int) -> Optional[str]:
        """Where a shard's live images are logged (live_dir itself when there is one shard)."""
        if self.live_dir is None or self.shards == 1:
            return self.live_dir
        return os.path.join(self.live_dir, f"shard-{shard:03d}")

    def live_dir_of(self, image_id: str) -> Optional[str]:
        """The live folder of the shard that owns an image id."""
        from edje.storage.shards import shard_of

        return self.live_dir_of_shard(shard_of(image_id, self.shards))

    def replace(self, **changes: Any) -> "ServeConfig":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)
