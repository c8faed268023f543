"""Torch modules and the reranking core, installed as `edje.model`: backbone and its weights, adapters, joint encoder,
scoring and ranking (ARCHITECTURE.md lists each module; the token store, the FAISS index and hub fetching are
`edje.storage`)."""
