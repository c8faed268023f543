"""Research baselines and labs, installed as `edje.research`: measured beside the product, never imported by it
(the import contracts in pyproject.toml)."""
