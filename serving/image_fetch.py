"""Image bytes for the ingress: http(s) urls fetched with a size and time limit, base64 decoded with a size limit.

Every failure is the client's input and becomes an ImageInputError with a 4xx status: 413 when the
image is larger than allowed, 422 when a url cannot be fetched (refused, unresolvable, timed out,
an error status) or the text is not base64. Decoding the pixels is the reranker's job
(serving/live_images.py), where corrupt images and decompression bombs are refused.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import urllib.error
import urllib.parse
import urllib.request
from typing import Collection, Optional, Tuple


class ImageInputError(ValueError):
    """An image the client gave that cannot be used: an HTTP status (4xx) and a message."""

    def __init__(self, status: int, detail: str):
        self.status, self.detail = status, detail
        super().__init__(detail)


def _check_host(url: str, allowed_hosts: Optional[Collection[str]]) -> None:
    try:
        parts = urllib.parse.urlsplit(url)
        host, _ = parts.hostname, parts.port  # .port raises on a bad port
    except ValueError as e:
        raise ImageInputError(422, f"not a valid url: {url}: {e}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ImageInputError(422, f"not an http(s) url: {url}")
    if allowed_hosts is not None and host not in allowed_hosts:
        raise ImageInputError(422, f"image urls on host {host!r} are not fetched by this server "
                                   f"(allowed: {sorted(allowed_hosts)})")


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects only to allowed hosts (a redirect must not take the server where a url could not)."""

    def __init__(self, allowed_hosts: Optional[Collection[str]]):
        self.allowed_hosts = allowed_hosts

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        _check_host(newurl, self.allowed_hosts)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _fetch(url: str, max_bytes: int, timeout_s: float, allowed_hosts: Optional[Collection[str]] = None) -> bytes:
    _check_host(url, allowed_hosts)  # before any name lookup or connection
    req = urllib.request.Request(url, headers={"User-Agent": "edje-reranker/1", "Accept": "image/*"})
    opener = urllib.request.build_opener(_CheckedRedirects(allowed_hosts))
    try:
        with opener.open(req, timeout=timeout_s) as r:
            length = r.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise ImageInputError(413, f"image at {url} is {length} bytes, more than the limit {max_bytes}")
            data = r.read(max_bytes + 1)
    except ImageInputError:
        raise
    except urllib.error.HTTPError as e:
        raise ImageInputError(422, f"could not fetch {url}: the server answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ImageInputError(422, f"could not fetch {url}: {reason}") from None
    if len(data) > max_bytes:
        raise ImageInputError(413, f"image at {url} is more than the limit of {max_bytes} bytes")
    if not data:
        raise ImageInputError(422, f"image at {url} is empty")
    return data


async def fetch_image(url: str, max_bytes: int, timeout_s: float, allowed_hosts: Optional[Collection[str]] = None) -> bytes:
    """The body at an http(s) url (in a thread: the event loop keeps serving); ImageInputError on failure."""
    return await asyncio.to_thread(_fetch, url, max_bytes, timeout_s, allowed_hosts)


def decode_base64(text: str, max_bytes: int) -> bytes:
    """Bytes of base64 text (a data: url's payload or bare base64, whitespace allowed); ImageInputError on failure."""
    if text.startswith("data:"):
        text = text.split(",", 1)[1] if "," in text else ""
    text = "".join(text.split())
    if len(text) * 3 // 4 > max_bytes + 2:
        raise ImageInputError(413, f"base64 image is more than the limit of {max_bytes} bytes")
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageInputError(422, f"image is not valid base64: {e}") from None
    if not data:
        raise ImageInputError(422, "base64 image is empty")
    if len(data) > max_bytes:
        raise ImageInputError(413, f"base64 image is {len(data)} bytes, more than the limit {max_bytes}")
    return data


async def image_bytes(kind: str, value: str, max_bytes: int, timeout_s: float,
                      allowed_hosts: Optional[Collection[str]] = None) -> Tuple[bytes, str]:
    """(bytes, source) of a ('url' | 'base64', value) reference; the source is the url, or '' for base64."""
    if kind == "url":
        return await fetch_image(value, max_bytes, timeout_s, allowed_hosts), value
    return decode_base64(value, max_bytes), ""
