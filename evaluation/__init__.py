"""Retrieval and binding figures, installed as `edje.evaluation`: first stage and reranking, twin pairs, calibration,
probes, comparison tables and model cards (ARCHITECTURE.md lists each module)."""
