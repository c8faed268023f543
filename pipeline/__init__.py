"""The encode and compress jobs' stages on Ray Data, installed as `edje.pipeline`: read, validate, dedupe, plan,
download, decode, encode, write (ARCHITECTURE.md lists each module)."""
