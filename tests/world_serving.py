"""A small sample world served by Ray Serve, for the search-page and integration tests.

The world's test split goes through the shipped checkpoint's backbone and adapter (conftest's
encode_world_with_checkpoint) into one compressed int8 table whose urls point at a loopback image server,
as the quickstart's img2dataset step would record them.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import numpy as np
import requests

from edje.serving.ports import free_port

REPO = Path(__file__).resolve().parent.parent
CHECKPOINT = str(REPO / "checkpoints" / "edje-local-bind")


class Remote:
    """A stand-in deployment method for in-process ingress tests: `await x.remote(...)` calls fn."""

    def __init__(self, fn):
        self.fn = fn

    async def remote(self, *args):
        return self.fn(*args)


@dataclass
class World:
    """A generated, encoded sample world: its folder, annotation file, table, ids and first captions."""

    root: Path
    annotations: str
    table: str
    image_ids: List[str]
    captions: List[str]  # the first caption of each image, in image_ids order

    @property
    def images(self) -> Path:
        """The folder of <id>.jpg files."""
        return self.root / "images"


def encode_world(root: Path, seed: int, n_test: int, base_url: str, checkpoint: str = CHECKPOINT,
                 kind: str = "shapes") -> World:
    """Generate and encode a world's test split (of world kind `kind`, through `checkpoint`); the table's urls are
    `base_url`/images/<id>.jpg."""
    from conftest import encode_world_with_checkpoint

    from edje.schemas.annotations import load_annotations
    from edje.schemas.token_table import build_table, write_token_table

    ann_path, table, tokens, cmeta = encode_world_with_checkpoint(root, seed, n_test, checkpoint, kind)
    ids = table.column("image_id").to_pylist()
    emb = np.stack([np.asarray(v, np.float32) for v in table.column("image_embedding").to_pylist()])
    path = str(root / "compressed.parquet")
    write_token_table(build_table(cmeta, ids, tokens, emb, urls=[f"{base_url}/images/{i}.jpg" for i in ids]), path)
    ann = load_annotations(ann_path)
    first = [ann.captions[c[0]] for c in ann.image_to_captions()]
    return World(root / "world", str(ann_path), path, list(ann.image_ids), first)



@contextlib.contextmanager
def serving(*apps: Tuple[str, str, object], token: Optional[str] = None) -> Iterator[Tuple[str, requests.Session]]:
    """Serve on a free loopback port, one application per (name, route prefix, ServeConfig); yields the base url and
    a session (sending the bearer token when given). Serve is shut down after, whatever happened: the one way the
    tests start Serve."""
    from ray import serve

    from edje.serving.app import build

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        # All at once: their replicas start side by side instead of one application after another.
        serve.run_many([serve.RunTarget(build(config), name=name, route_prefix=prefix) for name, prefix, config in apps])
        yield f"http://127.0.0.1:{port}", session(token) if token else requests.Session()
    finally:
        serve.shutdown()


def session(token: str) -> requests.Session:
    """A requests session that sends the bearer token."""
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {token}"
    return http
