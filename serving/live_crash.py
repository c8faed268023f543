"""Named steps where a live log process dies on purpose, for the crash tests (tests/test_live_log.py).

A test sets ``EDJE_LIVE_LOG_CRASH_AT`` to one of ``CRASH_STEPS``; the process reaching that step exits at once
with ``CRASH_EXIT`` (``os._exit``: no cleanup, what a kill -9 leaves). Unset, a crash point does nothing.
"""
from __future__ import annotations

import os

CRASH_ENV, CRASH_EXIT = "EDJE_LIVE_LOG_CRASH_AT", 86
CRASH_STEPS = ("linked", "rotated", "part_tmp", "part_renamed", "manifest_written", "segment_dropped",
               "legacy_appended")


def crash_point(step: str) -> None:
    """Die here when the test names this step (no cleanup: what a kill -9 leaves)."""
    if os.environ.get(CRASH_ENV) == step:
        os._exit(CRASH_EXIT)
