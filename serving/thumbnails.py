"""Thumbnails of corpus images (GET /v1/images/{image_id}/thumbnail): small JPEGs for the search page, cached.

Token tables hold tokens, not pixels, so the picture of an image id comes from elsewhere; the first source
that has it wins:
1. `image_dir`: a local folder holding `<id>`, `<id>.jpg`, `.jpeg`, `.png` or `.webp` (the sample world's
   `images/`, the quickstart's), never a path outside it;
2. the bytes kept for a live image (serving/live_sources.py);
3. a url: `image_url_prefix` + the id (or the prefix with `{image_id}` replaced) when configured, else the
   url the corpus stores for the id; fetched by serving/image_fetch.py under the same address policy as
   every image url (`image_url_hosts`, `image_url_allow`).
None has it: 404. A source that has it but cannot give it (unreachable, not an image): 502 naming why.
Thumbnails are made off the event loop (a thread) and kept in an LRU per ingress replica.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import io
import os
import urllib.parse
from typing import Awaitable, Callable, Optional, Tuple

from fastapi import APIRouter, FastAPI, HTTPException, Path, Request, Response
from PIL import Image

from edje.model.image_decode import ImageRejected, open_image, to_rgb
from edje.serving.image_fetch import ImageInputError, fetch_image
from edje.serving.live_sources import read_source

THUMBNAIL_SIZE = 256  # longest side in pixels: sharp at the page's ~128 px on a 2x screen
JPEG_QUALITY = 85
CACHE_ENTRIES = 1024  # ~10 kB each
EXTENSIONS = ("", ".jpg", ".jpeg", ".png", ".webp")
PLACEHOLDER = "{image_id}"

StoredUrl = Callable[[str], Awaitable[Optional[str]]]


class ThumbnailUnavailable(Exception):
    """No thumbnail for an id: `status` 404 (no source has it) or 502 (a source failed), and why."""

    def __init__(self, status: int, detail: str):
        self.status, self.detail = status, detail
        super().__init__(detail)


def make_thumbnail(data: bytes, size: int = THUMBNAIL_SIZE, max_pixels: int = 40_000_000) -> bytes:
    """JPEG bytes of the image shrunk to fit size x size (never enlarged); ImageRejected when not an image."""
    im = open_image(data, max_pixels)  # bombs refused from the header, as for every image the server decodes
    if im.format == "JPEG":
        im.draft("RGB", (size, size))  # libjpeg decodes at a reduced scale: big photos cost a fraction
    im = to_rgb(im)
    im.thumbnail((size, size), Image.LANCZOS)
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=JPEG_QUALITY, optimize=True)
    return buf.getvalue()


def image_dir_file(image_dir: str, image_id: str) -> Optional[str]:
    """The file of an id in the image folder, or None (absent, or a name that would leave the folder)."""
    root = os.path.realpath(image_dir)
    for ext in EXTENSIONS:
        try:
            path = os.path.realpath(os.path.join(root, image_id + ext))
        except ValueError:  # a NUL in the id
            return None
        if os.path.commonpath([root, path]) != root:  # '..', an absolute id, a link out of the folder
            return None
        if os.path.isfile(path):
            return path
    return None


def prefix_url(prefix: str, image_id: str) -> str:
    """The url of an id under a url prefix; the id is quoted whole, so it can never change the host or path above."""
    quoted = urllib.parse.quote(image_id, safe="")
    return prefix.replace(PLACEHOLDER, quoted) if PLACEHOLDER in prefix else prefix + quoted


class LRU:
    """A small least-recently-used map of id -> bytes."""

    def __init__(self, capacity: int):
        self.capacity, self.items = capacity, collections.OrderedDict()

    def get(self, key: str) -> Optional[Tuple[bytes, str]]:
        """The cached value, or None."""
        got = self.items.get(key)
        if got is not None:
            self.items.move_to_end(key)
        return got

    def put(self, key: str, value: Tuple[bytes, str]) -> None:
        """Insert, evicting the least recently used past capacity."""
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)


class Thumbnails:
    """The thumbnails of one served configuration (ServeConfig); `stored_url(id)` asks the corpus for its url."""

    def __init__(self, config, stored_url: StoredUrl, size: int = THUMBNAIL_SIZE, cache_entries: int = CACHE_ENTRIES):
        self.config, self.stored_url, self.size = config, stored_url, size
        self.cache = LRU(cache_entries)

    async def get(self, image_id: str) -> Tuple[bytes, str]:
        """(JPEG bytes, ETag) of an id's thumbnail; ThumbnailUnavailable when there is none."""
        hit = self.cache.get(image_id)
        if hit is not None:
            return hit
        data, where = await self.original(image_id)
        try:
            thumb = await asyncio.to_thread(make_thumbnail, data, self.size, self.config.max_image_pixels)
        except ImageRejected as e:
            raise ThumbnailUnavailable(502, f"the image of {image_id!r} ({where}) cannot be decoded: {e}") from None
        out = (thumb, '"' + hashlib.sha256(thumb).hexdigest()[:32] + '"')
        self.cache.put(image_id, out)
        return out

    async def original(self, image_id: str) -> Tuple[bytes, str]:
        """(bytes, where they came from) of the first source that has the id; ThumbnailUnavailable otherwise."""
        cfg = self.config
        if cfg.image_dir:
            path = await asyncio.to_thread(image_dir_file, cfg.image_dir, image_id)
            if path is not None:
                return await asyncio.to_thread(_read, path), "image_dir"
        kept = await asyncio.to_thread(read_source, cfg.live_dir_of(image_id), image_id)
        if kept is not None:
            return kept, "live image"
        url = prefix_url(cfg.image_url_prefix, image_id) if cfg.image_url_prefix else await self.stored_url(image_id)
        if not url:
            raise ThumbnailUnavailable(404, f"no image for {image_id!r}: not in image_dir, not a live image, no url")
        try:
            data = await fetch_image(url, cfg.max_image_bytes, cfg.image_fetch_timeout_s, cfg.image_url_hosts,
                                     cfg.image_url_allow)
        except ImageInputError as e:
            raise ThumbnailUnavailable(502, f"the image of {image_id!r}: {e.detail}") from None
        return data, url


def add_thumbnail_route(app: FastAPI | APIRouter, thumbnails: Thumbnails, dependencies: list, responses: dict,
                        max_id_chars: int) -> None:
    """GET /v1/images/{image_id}/thumbnail on `app` (behind the app's bearer token like every /v1 route)."""

    @app.get("/v1/images/{image_id:path}/thumbnail", response_class=Response, dependencies=dependencies,
             responses={200: {"content": {"image/jpeg": {}}, "description": "a JPEG at most 256 px on its longest side"},
                        **responses},
             summary="A small JPEG of a corpus image (from the image folder, a live image's bytes or its url)")
    async def thumbnail(request: Request,
                        image_id: str = Path(..., min_length=1, max_length=max_id_chars, description="an image id")):
        try:
            data, etag = await thumbnails.get(image_id)
        except ThumbnailUnavailable as e:
            raise HTTPException(e.status, e.detail) from None
        # private: the bytes are behind the token, so shared caches must not keep them
        headers = {"ETag": etag, "Cache-Control": "private, max-age=86400"}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(data, media_type="image/jpeg", headers=headers)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
