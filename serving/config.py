"""Typed configuration of the serving application: what to load, limits, batching, resources."""
from __future__ import annotations

import dataclasses
import operator
import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Tuple

from pydantic import ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass as validated_dataclass

from edje.schemas.api import ApiLimits
from edje.schemas.cli_options import option, sub_option
from edje.serving.image_fetch import parse_allow

Precision = Literal["auto", "fp32", "bf16", "fp16"]
AtLeastOne = Annotated[int, Field(ge=1)]


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
    # A stopping replica sleeps this long before each look at its requests in flight, so even an idle one takes this
    # long to go on every redeploy, scale-down and shutdown (Serve's default: 2 s). Ours answer in well under a
    # second, and looking more often drains them just as fully (graceful_shutdown_timeout_s still bounds the wait).
    graceful_shutdown_wait_loop_s: float = 0.5

    def __post_init__(self) -> None:
        if min(self.health_check_period_s, self.health_check_timeout_s, self.graceful_shutdown_wait_loop_s) <= 0:
            raise ValueError("health_check_period_s, health_check_timeout_s and graceful_shutdown_wait_loop_s must be > 0")
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
                       graceful_shutdown_wait_loop_s=self.graceful_shutdown_wait_loop_s,
                       ray_actor_options={"num_cpus": self.num_cpus, "num_gpus": self.num_gpus})
        if self.num_replicas is not None:
            options["num_replicas"] = self.num_replicas
        elif default_replicas != 1:
            options["num_replicas"] = default_replicas
        if self.max_queued_requests is not None:
            options["max_queued_requests"] = self.max_queued_requests
        return options


# Validated by pydantic (types, ranges, choices) and still a dataclass (fields, replace, asdict, its options);
# __post_init__ checks what depends on several fields. An unknown keyword is refused, as a plain dataclass does.
@validated_dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class ServeConfig:
    """Everything `edje.serving.app.build_app` needs; `checkpoint=None` serves the hard-negative miner alone."""

    # Each option's flag (jobs/serve.py) is written here: `option(...)`, with the field's default.
    checkpoint: Optional[str] = option(None, help="EDJE checkpoint dir (any fsspec path); omit to serve the miner alone")
    # compressed token tables made with that checkpoint's adapter
    token_tables: Tuple[str, ...] = option((), flag="--tokens", nargs="+", help="compressed token tables (globs allowed)")
    # Miner corpus. Images: token tables of any kind (image_id + image_embedding), default the served ones.
    # Captions: raw token tables (caption + text_embedding columns) or Karpathy-style annotation JSON files
    # (captions embedded by the backbone's text tower at start-up).
    miner_image_tables: Tuple[str, ...] = option((), flag="--miner-images", nargs="+",
                                                 help="miner image tables (default: --tokens)")
    caption_sources: Tuple[str, ...] = option((), flag="--captions", nargs="+",
                                              help="miner caption sources: raw token tables or annotation JSON")
    backbone_pretrained: Optional[str] = None  # overrides the tables' pretrained tag/path for the text tower
    model_name: str = option("edje")
    # Limits (422 beyond them).
    max_documents: AtLeastOne = option(1000)
    max_text_chars: AtLeastOne = 2000
    max_pairs: AtLeastOne = 1024  # pairs per /v1/negatives request
    max_top_k: AtLeastOne = 1000  # first-stage candidates per /v1/search
    # Reranker.
    dynamic_batching: bool = option(True, flag="--no-batching", action="store_true", convert=operator.not_,
                                    help="disable @serve.batch dynamic batching")
    max_batch_pairs: AtLeastOne = option(256)  # pairs per joint-encoder forward; larger requests are split
    batch_wait_timeout_s: float = 0.005
    precision: Precision = option("auto")  # auto = fp32 on CPU, bf16 on GPU
    torch_threads: Optional[int] = option(None)  # intra-op threads per CPU replica (None = the replica's num_cpus, >= 1)
    index_factory: str = option("Flat", help="FAISS index of the first stage (default Flat; 'IVF1024,PQ32' for large "
                                "corpora)")
    index_search_params: str = option("", help="its search parameters, as faiss.ParameterSpace takes them ('nprobe=32')")
    # Shards (serving/shards.py): the corpus split by a hash of the image id; each shard is its own FirstStage and
    # Reranker deployment holding only its rows (and its live images, under live_dir/shard-<s>). 1 = one of each.
    shards: AtLeastOne = option(1, help="split the corpus into this many shards by a hash of the image id: one FirstStage "
                         "and one Reranker deployment per shard, each holding its rows only (default 1)")
    shard: Annotated[int, Field(ge=0)] = 0  # the shard a replica serves (set per shard deployment by serving/app.py)
    # Replicas of each shard's FirstStage and Reranker (Serve's num_replicas; a deployment's own num_replicas, e.g.
    # --reranker-replicas, wins): a shard answers while one of its replicas does, and the ingress retries a call
    # whose replica died mid-request once, on another replica.
    replicas_per_shard: AtLeastOne = option(1, help="replicas of each shard's FirstStage and Reranker: a shard answers while "
                                     "one of them does (default 1; --reranker-replicas, when given, sets the Reranker's)")
    # Live images (POST /v1/images, image documents; serving/live_images.py). live_dir: the shared append log
    # that every replica applies and that persists added images as token tables (None: no /v1/images route).
    live_dir: Optional[str] = option(None, help="shared folder of the live-image log (enables POST /v1/images; added "
                                     "images persist there as token tables and are loaded at start)")
    max_image_bytes: AtLeastOne = 10_000_000  # encoded image size (413 beyond); base64 text is 4/3 of it
    max_image_pixels: AtLeastOne = 40_000_000  # decoded width x height (decompression bombs: 413)
    max_image_documents: AtLeastOne = 16  # inline images per rerank request (each is fetched and encoded)
    image_fetch_timeout_s: float = 10.0  # per url
    # hosts image urls may name (redirects included); None = any
    image_url_hosts: Optional[Tuple[str, ...]] = option(None, nargs="+", help="hosts image urls may name (default: any)")
    # Non-public addresses image urls may reach: CIDRs or addresses ("127.0.0.1/32"), "loopback", or host names.
    # None = public addresses only: loopback, private, link-local (cloud metadata) and the like are refused (422).
    image_url_allow: Optional[Tuple[str, ...]] = option(
        None, nargs="+", help="non-public addresses image urls may reach: CIDRs, 'loopback' or host names "
        "(default: none; loopback, private and link-local addresses are refused)")
    image_cache_size: AtLeastOne = 1024  # encoded inline images kept per reranker replica (by content hash)
    # Search page (GET /ui, serving/search_page.py) and thumbnails (GET /v1/images/{id}/thumbnail,
    # serving/thumbnails.py; the route exists with the page or with an image source). Token tables hold no
    # pixels: image_dir is a local folder of <id>[.jpg|.jpeg|.png|.webp] files, image_url_prefix a url the id is
    # appended to (or put in place of "{image_id}"); without either, the corpus's stored url is fetched.
    ui: bool = option(False, help="serve the search page at /ui (static files; the API behind it keeps its token)")
    image_dir: Optional[str] = option(None, help="local folder of <image id>.jpg|.png|... files: the thumbnails' source")
    image_url_prefix: Optional[str] = option(None, help="url the image id is appended to (or put in place of "
                                             "{image_id}) to fetch a thumbnail's image (default: the corpus's stored url)")
    auth_token: Optional[str] = None  # bearer token; None = no auth (or taken from env auth_token_env)
    auth_token_env: Optional[str] = option("EDJE_API_TOKEN", help="environment variable holding the bearer token "
                                           "(default EDJE_API_TOKEN)")
    ready_timeout_s: Annotated[float, Field(gt=0)] = 5.0  # GET /readyz: how long each deployment may take to answer its probe (else 503)
    # max_ongoing_requests >= max_batch_pairs, so that small requests can fill a batch at one replica.
    # Deployments' resources have flags of their own per deployment (--reranker-replicas, --first-stage-gpus).
    reranker: DeploymentResources = option(DeploymentResources(num_cpus=1.0, max_ongoing_requests=256), nested={
        "num_replicas": sub_option("--reranker-replicas"), "num_gpus": sub_option("--reranker-gpus"),
        "num_cpus": sub_option("--reranker-cpus")})
    first_stage: DeploymentResources = option(DeploymentResources(), nested={"num_gpus": sub_option(
        "--first-stage-gpus", help="GPUs per first-stage replica (its text tower runs there)")})
    miner: DeploymentResources = option(DeploymentResources(), nested={"num_gpus": sub_option(
        "--miner-gpus", help="GPUs per miner replica (its text tower runs there)")})
    # Admission (overload): an ingress replica works on max_ongoing_requests requests at once and Serve's proxy
    # holds max_queued_requests more; any request beyond them gets 503 with Retry-After at once instead of
    # waiting. An admitted request waits about (ongoing + queued) / throughput at worst: size the two to the
    # rate the deployments sustain times the latency a client accepts (benchmarks/bench_shards.py --phases overload).
    ingress: DeploymentResources = option(DeploymentResources(max_ongoing_requests=64, max_queued_requests=64), nested={
        "max_ongoing_requests": sub_option("--ingress-max-ongoing",
                                           help="requests an ingress replica works on at once (default 64)"),
        "max_queued_requests": sub_option("--ingress-max-queued", help="requests Serve's proxy holds back for the "
                                          "ingress beyond those; more are answered 503 with Retry-After at once "
                                          "(default 64; -1: no limit)")})
    # Or a gate with no queue: an ingress replica works on at most this many requests (health, readiness and the
    # API description aside) and answers every further one 503 with Retry-After at once, so an admitted request
    # never waits behind others; Serve's queue cannot do that (max_queued_requests is -1 or >= 1). The ingress's
    # max_ongoing_requests must exceed it, so that Serve hands the excess to the gate. None: Serve's limits alone.
    admit_in_flight: Optional[int] = option(
        None, help="a gate with no queue: an ingress replica works on at most this many requests and answers each "
        "further one 503 with Retry-After at once (below --ingress-max-ongoing; default: no gate)")
    # the Retry-After header (seconds, rounded up) of every 503: overload, a lost replica
    retry_after_s: Annotated[float, Field(ge=0)] = option(1.0, flag="--retry-after",
                                                         help="seconds in the Retry-After header of a 503 (default 1)")

    @field_validator("token_tables", "miner_image_tables", "caption_sources", "image_url_allow", mode="before")
    @classmethod
    def _one_entry(cls, value: Any) -> Any:
        """A string is one entry, not a sequence of characters."""
        return (value,) if isinstance(value, str) else value

    @field_validator("image_url_allow")
    @classmethod
    def _allow_parses(cls, value: Optional[Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
        """A malformed entry fails here, at start-up, not at the first fetch."""
        if value is not None:
            parse_allow(value)
        return value

    @field_validator("image_url_prefix")
    @classmethod
    def _prefix_is_a_url(cls, value: Optional[str]) -> Optional[str]:
        """Thumbnails are fetched over http(s) only."""
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"image_url_prefix must be an http(s) url, got {value!r}")
        return value

    def __post_init__(self) -> None:
        if self.checkpoint is not None and not self.token_tables:
            raise ValueError("a checkpoint is served over token tables: token_tables is empty")
        if self.checkpoint is None and not (self.miner_image_tables and self.caption_sources):
            raise ValueError("without a checkpoint only the miner is served: it needs miner_image_tables and caption_sources")
        if not self.shard < self.shards:
            raise ValueError(f"shards must be >= 1 and 0 <= shard < shards, got shards={self.shards}, shard={self.shard}")
        if self.admit_in_flight is not None and not 1 <= self.admit_in_flight < self.ingress.max_ongoing_requests:
            raise ValueError(f"admit_in_flight must be >= 1 and below the ingress's max_ongoing_requests "
                             f"({self.ingress.max_ongoing_requests}), got {self.admit_in_flight}")

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
