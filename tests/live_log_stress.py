"""One process of the live log's stress test (tests/test_live_log.py): it adds images, compacts and polls at random
moments, and writes what happened to each id it tried.

    python tests/live_log_stress.py LIVE_DIR OUT_DIR ADDS SEED BUDGET_S PROCESSES K

Process K tries its own ids (p<K>-<i>) and ids that every process tries (c-<j>), in a shuffled order, one add at a
time as a replica makes it: under the lock, after reading every record there is, refused when the id is taken.
About 1 % of its own adds get an fsync that fails (the add must leave nothing behind). A second LiveLog in the
process polls without the lock at random moments, as a replica's request path does; after every process is done,
it polls once more and reports every id it applied.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import List


def ids_of(k: int, adds: int) -> List[str]:
    """The ids process k tries: its own, then the contested ones."""
    return [f"p{k}-{i}" for i in range(adds)] + [f"c-{j}" for j in range(adds // 10)]


def main(argv: List[str]) -> None:
    """Run process K of the stress test (the module docstring)."""
    from live_log_rows import EXPECTED, random_rows

    from edje.serving.live_log import LiveLog, LiveLogConfig

    live_dir, out_dir, adds, seed, budget_s, processes, k = argv
    adds, seed, budget_s, processes, k = int(adds), int(seed), float(budget_s), int(processes), int(k)
    out = Path(out_dir)
    rng = random.Random(seed * 1009 + k)
    table = random_rows(ids_of(k, adds), seed=100 + k)
    ids = table.column("image_id").to_pylist()
    order = list(range(table.num_rows))
    rng.shuffle(order)
    live = LiveLog(live_dir, LiveLogConfig(part_rows=rng.choice([40, 150, 500])), EXPECTED)
    reader = LiveLog(live_dir, expected=EXPECTED)

    real_fdatasync, failing = os.fdatasync, [False]

    def fdatasync(fd: int) -> None:
        if failing[0]:
            raise OSError(5, "injected: fsync failed")
        real_fdatasync(fd)

    os.fdatasync = fdatasync
    known, outcomes, applied = set(), {}, {}
    compactions = polls = 0

    def poll_reader() -> None:
        got = reader.poll()
        if got is None:
            return
        for image_id, tok in zip(got.column("image_id").to_pylist(), got.column("tokens").to_pylist()):
            # After a compaction a part may bring rows again: the same bytes, or the log is wrong.
            assert applied.setdefault(image_id, tok) == tok, f"{image_id} came back with other bytes"

    deadline = time.monotonic() + budget_s
    for i in order:
        if time.monotonic() > deadline:
            sys.exit(f"process {k}: out of time after {len(outcomes)} adds")
        image_id = ids[i]
        failing[0] = image_id.startswith("p") and rng.random() < 0.01
        with live.locked():
            got = live.poll_locked()
            if got is not None:
                known.update(got.column("image_id").to_pylist())
            if image_id in known:
                outcomes[image_id] = "taken"
            else:
                try:
                    live.append(table.slice(i, 1))
                    known.add(image_id)
                    outcomes[image_id] = "ok"
                except OSError:
                    outcomes[image_id] = "failed"
        failing[0] = False
        r = rng.random()
        if r < 1 / 40:
            compactions += live.compact() is not None
        elif r < 0.1:
            poll_reader()
            polls += 1
        if rng.random() < 0.2:
            time.sleep(rng.random() * 0.003)  # vary who holds the lock next
    (out / f"done-{k}").touch()
    while len(list(out.glob("done-*"))) < processes:
        if time.monotonic() > deadline:
            sys.exit(f"process {k}: the others did not finish in time")
        time.sleep(0.05)
    poll_reader()
    result = dict(outcomes=outcomes, reader=sorted(applied), compactions=compactions, polls=polls)
    (out / f"{k}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
    # Everything is written. pyarrow can abort in its own teardown at interpreter exit ("terminate called without
    # an active exception": a pool thread still joinable, apache/arrow#34314), rarely and after the work is done;
    # this test is about the log, so a child that finished skips that teardown. A failure above still raises.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
