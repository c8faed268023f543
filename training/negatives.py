"""Where a batch's hard negatives come from: the gathered batch (in-batch mining) or the miner service."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from edje.schemas.token_table import decode_tokens, read_token_tables
from edje.training.batches import TrainBatch
from edje.training.mining import MinerConfig, mine_hard_negatives


@dataclass
class Negatives:
    """Per local row: k negative images (as backbone tokens) for its caption, k negative captions for its image."""

    image_tokens: torch.Tensor  # [B, k, n, d]
    captions: List[List[str]]  # [B][k]
    # The first stage's cosines of the same pairs: each caption with its negative images, each image with its negative
    # captions [B, k] (in-batch mining has the embeddings at hand; the miner service does not return them).
    image_cos: Optional[torch.Tensor] = None
    text_cos: Optional[torch.Tensor] = None


def in_batch_negatives(cfg: MinerConfig, local: TrainBatch, gathered: TrainBatch, generator: Optional[torch.Generator] = None) -> Negatives:
    """Mine k negatives per row among the rows gathered from all workers (backbone similarities)."""
    neg_img, neg_txt = mine_hard_negatives(
        cfg, local.image_emb, local.text_emb, gathered.image_emb, gathered.text_emb,
        local.image_ids, local.captions, gathered.image_ids, gathered.captions, generator=generator)
    tokens = gathered.tokens[neg_img.reshape(-1)].reshape(len(local), cfg.k, *gathered.tokens.shape[1:])
    caps = [[gathered.captions[j] for j in row] for row in neg_txt.tolist()]
    image_cos = (local.text_emb.float()[:, None] * gathered.image_emb.float()[neg_img]).sum(-1)
    text_cos = (local.image_emb.float()[:, None] * gathered.text_emb.float()[neg_txt]).sum(-1)
    return Negatives(tokens.to(local.tokens.dtype), caps, image_cos, text_cos)


class TokenLookup:
    """Backbone tokens of every image of the training tables, by image id (for miner-chosen negatives).

    Holds the tables' tokens in memory, so it suits corpora that fit in a worker's RAM.
    """

    def __init__(self, paths: Sequence[str]):
        table, meta = read_token_tables(paths, kind="raw")
        self.tokens = torch.from_numpy(decode_tokens(table, meta)).to(torch.float16)
        ids = table.column("image_id").to_pylist()
        self.index: Dict[str, int] = {}
        for i, x in enumerate(ids):
            self.index.setdefault(x, i)

    def get(self, image_ids: Sequence[str]) -> torch.Tensor:
        """Tokens [len(ids), n, d]; KeyError naming ids that are not in the training tables."""
        missing = [i for i in image_ids if i not in self.index]
        if missing:
            raise KeyError(f"the miner returned image ids absent from the training tables: {missing[:5]}")
        return self.tokens[[self.index[i] for i in image_ids]].float()


class MinerNegatives:
    """Corpus-wide hard negatives from the miner service (POST /v1/negatives), tokens from a TokenLookup."""

    def __init__(self, url: str, k: int, lookup: TokenLookup):
        from edje.training.miner_client import fetch_negatives, session
        self.url, self.k, self.lookup = url, k, lookup
        self._fetch, self._http = fetch_negatives, session()

    def __call__(self, local: TrainBatch) -> Negatives:
        """Ask the miner for k negatives per pair; fall short of k and the batch is refused with a clear error."""
        mined = self._fetch(self.url, local.image_ids, local.captions, k=self.k, http=self._http)
        for row, (imgs, caps) in enumerate(zip(mined.image_ids, mined.captions)):
            if len(imgs) < self.k or len(caps) < self.k:
                raise ValueError(f"miner returned {len(imgs)} images / {len(caps)} captions for pair {row}, need k={self.k}")
        ids = [i for row in mined.image_ids for i in row[:self.k]]
        tokens = self.lookup.get(ids).reshape(len(local), self.k, *self.lookup.tokens.shape[1:])
        return Negatives(tokens, [row[:self.k] for row in mined.captions])
