"""What crosses a boundary, installed as `edje.schemas`: configs, token-table schemas and codecs, annotation files,
job options and the HTTP API's models (ARCHITECTURE.md lists each module)."""
