"""The fixed vocabulary of reasons a row is dropped, and mapping raw error messages onto it.

Every dropped input row is counted under exactly one of these keys in the per-shard stats and
in summary.json, so that runs can be compared and tests can count planted bad inputs.
"""
from __future__ import annotations

import re

# Image problems (the one decoder, run inside img2dataset's worker and again before encoding).
from edje.model.image_decode import (  # noqa: F401  part of this vocabulary
    DECODE_ERROR,
    DECOMPRESSION_BOMB,
    IMAGE_REASONS,
    NOT_AN_IMAGE,
    TRUNCATED_IMAGE,
)

# Row-level problems found while reading the url list (before any download).
MALFORMED_ROW = "malformed_row"  # wrong field count, missing or unusable url / image id
EMPTY_CAPTION = "empty_caption"
CAPTION_NOT_UTF8 = "caption_not_utf8"
DUPLICATE_URL = "duplicate_url"
DUPLICATE_IMAGE_ID = "duplicate_image_id"  # same image_id given to two different urls

# Download problems (img2dataset's per-sample error_message, classified).
HTTP_ERROR = "http_error"  # the server answered with a 4xx / 5xx status
TIMEOUT = "timeout"
CONNECTION_ERROR = "connection_error"  # refused, reset, unknown host, closed without response
DISALLOWED = "disallowed"  # X-Robots-Tag noai / noindex
DOWNLOAD_ERROR = "download_error"  # anything else while fetching

# Reading an image the input already holds (a file, a tar member, a Parquet cell).
UNREADABLE_FILE = "unreadable_file"  # missing, unreadable, cut short, or no image bytes where the input points


READ_REASONS = (MALFORMED_ROW, EMPTY_CAPTION, CAPTION_NOT_UTF8, DUPLICATE_URL, DUPLICATE_IMAGE_ID)
ALL_REASONS = (READ_REASONS + (HTTP_ERROR, TIMEOUT, CONNECTION_ERROR, DISALLOWED, DOWNLOAD_ERROR, UNREADABLE_FILE)
               + IMAGE_REASONS)

_HTTP = re.compile(r"HTTP Error \d{3}")


def classify_download_error(message: str) -> str:
    """Map a urllib error message (as img2dataset records it) onto a download reason."""
    m = message or ""
    low = m.lower()
    if _HTTP.search(m):
        return HTTP_ERROR
    if "timed out" in low or "timeout" in low:
        return TIMEOUT
    if "x-robots-tag" in low:
        return DISALLOWED
    if any(s in low for s in ("refused", "reset by peer", "name or service not known", "nodename nor servname",
                              "no route to host", "network is unreachable", "closed connection",
                              "remote end closed", "temporary failure in name resolution", "connection aborted",
                              "remotedisconnected", "incompleteread", "broken pipe")):
        return CONNECTION_ERROR
    return DOWNLOAD_ERROR


def split_reason(message: str) -> tuple[str, str]:
    """Split our own '<reason>: <detail>' messages; anything else is a download error message."""
    head, _, detail = (message or "").partition(": ")
    if head in IMAGE_REASONS:
        return head, detail
    return classify_download_error(message), message
