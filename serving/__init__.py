"""Ray Serve deployments of the EDJE reranker and hard-negative miner (issue 5).

token_store  compressed token tables -> contiguous arrays, gather by image id (TokenStoreServer)
reranker     joint encoder behind @serve.batch; only `model.encoder.score` scores (Reranker)
first_stage  FAISS inner-product index over pooled image embeddings + the backbone's text tower (FirstStage)
miner        corpus-wide hard negatives by embedding similarity, optionally rescored (Miner)
ingress      FastAPI routes: /v1/rerank (Jina), /v2/rerank (Cohere), /v1/rerank/texts, /v1/search,
             /v1/negatives, /healthz, /v1/info (Ingress)
app          ServeConfig -> application graph (`serving.app:build_app` is serve_config.yaml's import path)
miner_client what training calls: fetch_negatives(url, image_ids, captions, k), neighbour_batch(...)
"""
