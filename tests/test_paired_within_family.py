"""The paired within-family reading (research/paired_within_family.py): a first stage that brings a hard query into
the top k lowers within-family as evaluated, while over the shared queries and twins the two pairs read the same."""
from __future__ import annotations

import numpy as np

from edje.research.confidence_fusion import Capture
from edje.research.paired_within_family import paired


def _capture(hard_in_top_k: bool) -> Capture:
    """Four queries, answer q is image 2q, its twin 2q+1 (one family each), k 3, best first. Queries 0-2: answer,
    twin, filler, the answer ranked first. Query 3 (hard): the twin ranks first; in A's top k its answer is missing."""
    idx = np.array([[0, 1, 8], [2, 3, 8], [4, 5, 8], [7, 6, 8] if hard_in_top_k else [7, 8, 9]])
    itm = np.tile(np.array([3.0, 2.0, 1.0], np.float32), (4, 1))
    group = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 5])
    return Capture(np.zeros((4, 3), np.float32), idx, itm, [np.array([2 * q]) for q in range(4)], group, None, None,
                   ["a dog"] * 4)


def test_a_hard_query_brought_into_the_top_k_lowers_the_figure_as_evaluated_not_the_shared_one():
    a, b = _capture(False), _capture(True)
    orders = [c.idx for c in (a, b)]  # the ITM logits already rank each row as it is laid out
    out = paired([a, b], orders, np.arange(4))
    assert out["as_evaluated"] == [{"within_family": 100.0, "queries": 3}, {"within_family": 75.0, "queries": 4}]
    assert out["shared"] == {"within_family": [100.0, 100.0], "queries": 3}
