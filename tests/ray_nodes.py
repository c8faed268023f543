"""Local Ray nodes for tests that start `ray start` daemons of their own: finding what they left behind."""
from __future__ import annotations

import os
from pathlib import Path


def our_processes(marker: str) -> list:
    """Pids whose command line names `marker` (the test's own temp dir): its daemons and workers, never another's."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids
