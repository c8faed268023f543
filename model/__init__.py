"""Torch modules and the reranking core, installed as `edje.model`: backbone, adapters, joint encoder, scoring, the
FAISS index and the token store it reads (ARCHITECTURE.md lists each module)."""
