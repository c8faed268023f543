"""MLM masking policies: random caption wordpieces (BERT's), or binding-targeted word groups.

Binding-targeted masking hides every word of ONE attribute group of a caption (all colour words,
or all shape words, ...). With one colour word masked, the image's colours minus the caption's
other colour words give it away without binding; with all of them masked, the image must say
which colour goes with which shape. The groups come from a lexicon: the sample world's caption
vocabulary by default (`WordGroups.sample_world`), or a JSON file of {group: [words]} for real
captions (content words: colour adjectives, nouns, spatial words).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import fsspec
import torch


@dataclass(frozen=True)
class WordGroups:
    """Named groups of words; each word maps to a canonical value (synonyms share one)."""

    groups: Tuple[Tuple[str, Tuple[Tuple[str, str], ...]], ...]  # ((group, ((word, value), ...)), ...)

    @property
    def names(self) -> Tuple[str, ...]:
        """Group names, in index order."""
        return tuple(g for g, _ in self.groups)

    @staticmethod
    def sample_world() -> "WordGroups":
        """The sample world's caption vocabulary: colour, shape, size and spatial words."""
        from edje.sampleworld.captions import COLOUR_WORDS, SHAPE_WORDS, SIZE_WORDS

        def words(table):
            return tuple((w, value) for value, ws in table.items() for phrase in ws for w in phrase.split())

        # "sign" of "plus sign" is a shape word; spatial words are the relation phrases' content words.
        relation = (("left", "left"), ("right", "right"), ("above", "above"), ("over", "above"), ("top", "above"),
                    ("below", "below"), ("beneath", "below"), ("under", "below"), ("bottom", "below"))
        return WordGroups((("colour", words(COLOUR_WORDS)), ("shape", words(SHAPE_WORDS)),
                           ("size", words(SIZE_WORDS)), ("relation", relation)))

    @staticmethod
    def load(path: str) -> "WordGroups":
        """{group: [word, ...]} or {group: {word: value}} from a JSON file (any fsspec path)."""
        with fsspec.open(path, "r") as f:
            raw = json.load(f)
        out = []
        for g, ws in raw.items():
            pairs = ws.items() if isinstance(ws, dict) else ((w, w) for w in ws)
            out.append((g, tuple((str(w).lower(), str(v)) for w, v in pairs)))
        if not out:
            raise ValueError(f"{path} names no word groups")
        return WordGroups(tuple(out))

    def to_json(self) -> Dict[str, Dict[str, str]]:
        """{group: {word: value}} (the form `load` reads)."""
        return {g: dict(ws) for g, ws in self.groups}


class PieceGroups:
    """Per wordpiece id of a tokenizer: its group index (-1 for none) and canonical value id."""

    def __init__(self, groups: WordGroups, tokenizer, weights: Optional[Dict[str, float]] = None):
        n = max(len(tokenizer), tokenizer.vocab_size)
        self.names = groups.names
        unknown = set(weights or {}) - set(self.names)
        if unknown:
            raise ValueError(f"mask weights name unknown groups {sorted(unknown)}; groups: {list(self.names)}")
        # How often each present group is the one masked, relative to the others (default: all alike).
        self.weights = torch.tensor([float((weights or {}).get(name, 1.0)) for name in self.names])
        self.group = torch.full((n,), -1, dtype=torch.long)
        self.value = torch.full((n,), -1, dtype=torch.long)
        values: Dict[Tuple[int, str], int] = {}
        for gi, (_, words) in enumerate(groups.groups):
            for word, value in words:
                vid = values.setdefault((gi, value), len(values))
                for piece in tokenizer.tokenize(word):
                    pid = tokenizer.convert_tokens_to_ids(piece)
                    if self.group[pid] < 0:  # a piece shared by two groups keeps its first
                        self.group[pid], self.value[pid] = gi, vid
        self.candidates = [torch.nonzero(self.group == g).squeeze(1) for g in range(len(self.names))]

    def of(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Group index of every position (-1 outside every group)."""
        return self.group.to(input_ids.device)[input_ids]

    def group_mask(self, input_ids: torch.Tensor, text_mask: torch.Tensor,
                   generator: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(masked [B, T] bool, chosen group [B]): all words of one group present in each caption.

        A caption with no group word gets no mask (chosen group -1)."""
        g = self.of(input_ids).masked_fill(~text_mask, -1)
        present = torch.stack([(g == k).any(1) for k in range(len(self.names))], 1)
        weights = present.float().cpu() * self.weights + 1e-12  # a row with none present draws anything, masked below
        pick = torch.multinomial(weights, 1, generator=generator).squeeze(1).to(input_ids.device)
        pick = torch.where(present.any(1), pick, torch.full_like(pick, -1))
        return (g == pick[:, None]) & (pick[:, None] >= 0), pick

    def mask_policy(self, batch, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """`JointEncoder.mlm_logits` mask policy: the positions of one group's words per caption."""
        return self.group_mask(batch.input_ids, batch.text_mask, generator)[0]

    def readout_accuracy(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Share of masked group words whose argmax among the group's words is right (synonyms as one)."""
        keep = labels != -100
        logits, labels = logits[keep], labels[keep]
        group = self.group.to(labels.device)[labels]
        value = self.value.to(labels.device)
        right = torch.zeros(len(labels), dtype=torch.bool, device=labels.device)
        for k, cand in enumerate(self.candidates):
            sel = group == k
            if sel.any():
                cand = cand.to(logits.device)
                right[sel] = value[cand[logits[sel][:, cand].argmax(1)]] == value[labels[sel]]
        return right.float().mean() if len(labels) else logits.new_zeros(())

    def readout(self, logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
        """Binding read-out: per group, accuracy of the argmax among that group's words, synonyms as one."""
        out: Dict[str, float] = {}
        groups = self.group.to(labels.device)[labels]
        for k, name in enumerate(self.names):
            sel = groups == k
            if not sel.any():
                continue
            cand = self.candidates[k].to(logits.device)
            best = cand[logits[sel][:, cand].argmax(1)]
            value = self.value.to(labels.device)
            out[name] = float((value[best] == value[labels[sel]]).float().mean())
        return out
