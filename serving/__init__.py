"""Ray Serve application of the EDJE reranker and hard-negative miner, installed as `edje.serving`: plain cores, thin
Serve shells.

live_log       the shared append log of added images and its compaction into Parquet parts (LiveLog)
live_record    the log's bytes: header, checksummed records, scan and decode
live_log_migration  the older one-table-per-image layout folded into the log
live_crash     named steps where a live log process dies on purpose (crash tests)
durable_files  fsync, atomic writes and flock locks for local files
live_images    images added at run time: bytes -> model/token_encoder.py rows, one shared append log (LiveImages)
reranker_core  token store + model/scoring.py + live images of one replica, no Serve (RerankerCore)
reranker       the Serve deployment around RerankerCore: @serve.batch across requests (Reranker)
first_stage    FAISS index (storage/embedding_index.py) over pooled embeddings + the backbone's text tower (FirstStage)
miner          corpus-wide hard negatives by embedding similarity, optionally rescored (Miner)
image_fetch    image urls fetched with httpx, refusing non-public addresses unless allowed
live_sources   the source bytes of live images, kept beside the log (their thumbnails)
thumbnails     GET /v1/images/{id}/thumbnail: image folder, live bytes or url -> small cached JPEG
search_view    what /v1/search adds for people: first-stage order, the caption's own image
search_page    GET /ui: the static search page of serving/ui/ (HTML, JavaScript, CSS; no build step)
ingress        the Ingress deployment and build_api: the app from the middlewares and the route modules (Ingress)
http_guards    ASGI middlewares before any route: bearer auth, the admission gate (no queue)
http_errors    errors as HTTP: documented bodies, the 422 message, downstream failures by exception type
routes_rank    /v1/rerank (Jina), /v2/rerank (Cohere), /v1/rerank/texts, /v1/search
routes_corpus  /v1/images, /v1/images/{id}/thumbnail, /v1/negatives
routes_meta    /healthz, /readyz, /v1/info
serve_metrics  the Prometheus series (ray.serve.metrics) the Serve shells record, and the request-counting middleware
deployments    FirstStage and Miner made Serve deployments (the first stage's timed, with a readiness call)
app            ServeConfig -> application graph (`edje.serving.app:build_app` is serve_config.yaml's import path;
               the file's `deployments:` section sets replicas and resources over the code's options)
"""
