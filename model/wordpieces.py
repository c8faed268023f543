"""Caption wordpieces for the joint encoder: each distinct text tokenised once, rows laid out with tensor ops.

A rerank request repeats one query for every document, and a training batch repeats each caption
k times, so the tokenizer runs on the distinct texts of a call only (and, through `WordpieceCache`,
on texts not seen in recent calls); the `[CLS] caption [SEP] <image>xm [SEP]` rows are built for
the distinct texts with whole-tensor operations and gathered per pair.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from itertools import chain
from typing import Callable, Dict, List, Sequence, Tuple

import torch

Tokenize = Callable[[List[str]], List[List[int]]]


def distinct(texts: Sequence[str]) -> Tuple[List[str], torch.Tensor]:
    """Distinct texts in first-seen order, and for each text the index of its distinct copy ([B] long)."""
    index: Dict[str, int] = {}
    inverse = [index.setdefault(t, len(index)) for t in texts]
    return list(index), torch.tensor(inverse, dtype=torch.long)


class WordpieceCache:
    """Bounded LRU map text -> caption wordpieces, so captions seen in recent calls skip the tokenizer."""

    def __init__(self, maxsize: int = 1 << 16):
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize}")
        self.maxsize = maxsize
        self._rows: "OrderedDict[str, List[int]]" = OrderedDict()
        self._source: object = None
        # Serving threads and evaluation may share one encoder; OrderedDict reordering is not atomic.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def lookup(self, texts: List[str], tokenize: Tokenize, source: object) -> List[List[int]]:
        """Wordpieces of each text; `tokenize` runs once, on the texts not cached. `source` names the
        tokenizer and truncation: a different one empties the cache."""
        with self._lock:
            if source != self._source:
                self._rows.clear()
                self._source = source
            rows = [self._rows.get(t) for t in texts]
            missing = [t for t, r in zip(texts, rows) if r is None]
            fresh = iter(tokenize(missing) if missing else ())
            rows = [next(fresh) if r is None else r for r in rows]
            if self.maxsize:
                for t, r in zip(texts, rows):
                    self._rows[t] = r
                    self._rows.move_to_end(t)
                while len(self._rows) > self.maxsize:
                    self._rows.popitem(last=False)
            return rows

    # A lock does not pickle or deepcopy; a copy starts with an empty cache of the same size.
    def __getstate__(self):
        return {"maxsize": self.maxsize}

    def __setstate__(self, state):
        self.__init__(state["maxsize"])


def flat(rows: List[List[int]]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows of wordpieces as (all wordpieces in row order [sum of lengths] long, lengths [U, 1] long)."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    return torch.tensor(list(chain.from_iterable(rows)), dtype=torch.long), lengths[:, None]


def pair_rows(rows: List[List[int]], m: int, cls_id: int, sep_id: int, pad_id: int) -> Tuple[torch.Tensor, ...]:
    """`[CLS] w [SEP] <image>xm [SEP] [PAD]...` for each row of wordpieces `w`: (input_ids, attention_mask,
    token_type_ids, image_mask, text_mask), [U, T] with T = longest row + 3 + m; image positions hold pad ids."""
    if not rows:
        raise ValueError("no texts to lay out")
    words, n = flat(rows)
    j = torch.arange(int(n.max()) + 3 + m)
    text_mask = (j >= 1) & (j <= n)
    image_mask = (j >= n + 2) & (j < n + 2 + m)
    input_ids = torch.full(text_mask.shape, pad_id, dtype=torch.long)
    input_ids[:, 0] = cls_id
    input_ids[text_mask] = words  # row-major order of the mask = the rows' order
    input_ids[(j == n + 1) | (j == n + 2 + m)] = sep_id
    attention = (j < n + 3 + m).long()
    types = ((j >= n + 2) & (j < n + 3 + m)).long()  # image tokens and the final [SEP]
    return input_ids, attention, types, image_mask, text_mask


def text_rows(rows: List[List[int]], cls_id: int, sep_id: int, pad_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """`[CLS] w [SEP] [PAD]...` for each row of wordpieces: (input_ids, attention_mask), [U, longest + 2]."""
    if not rows:
        raise ValueError("no texts to lay out")
    words, n = flat(rows)
    j = torch.arange(int(n.max()) + 2)
    input_ids = torch.full((len(rows), j.numel()), pad_id, dtype=torch.long)
    input_ids[:, 0] = cls_id
    input_ids[(j >= 1) & (j <= n)] = words
    input_ids[j == n + 1] = sep_id
    return input_ids, (j < n + 2).long()
