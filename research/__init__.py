"""Research baselines and labs: measured beside the product, never imported by it (tests/test_import_graph.py)."""
