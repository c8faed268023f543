"""Hard-negative miner: for image-caption pairs, the hardest negative images and captions of the whole corpus.

Corpus (decided here, reported by GET /v1/info):
- images: `image_id` + pooled `image_embedding` of token tables of any kind (the served
  compressed tables by default, or raw training tables via `miner_image_tables`);
- captions: raw token tables (their `caption` + `text_embedding` columns, as the encode job
  wrote them) and/or Karpathy-style annotation JSON (`[{image, caption: str | [str], image_id}]`),
  whose captions are embedded by the backbone's text tower once at start-up.
All sources must name the same backbone (name, pretrained, feature layer, embedding width).

Negative images of a caption: nearest images to the caption's text embedding (FAISS inner
product), never the pair's own image, nor an image that carries an identical caption.
Negative captions of an image: nearest captions to the image embedding, never a caption of the
pair's image, nor one identical to the pair's caption, and each text at most once.
With `rescore`, a larger embedding pool is re-ranked by the joint encoder's ITM logit (the
negatives the reranker itself finds hardest).

Devices: the text tower (annotation captions at start-up, unknown captions per request) runs on
`device` (default: cuda when the replica sees a GPU, else cpu); the FAISS indexes stay on the CPU
(the search widens k up to the corpus size, beyond what GPU indexes answer).
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from edje.schemas.annotations import load_annotations
from edje.schemas.token_table import TableMetadata, read_metadata, read_token_tables, vector_matrix
from edje.serving.first_stage import EmbeddingIndex, embed_texts, load_backbone, read_image_embeddings

log = logging.getLogger("ray.serve")

SERVED_LOG = 1000  # answered requests kept by Miner.recent()


@dataclass
class CaptionCorpus:
    """Caption texts, the image each belongs to, and their normalised text embeddings."""

    captions: List[str]
    image_ids: List[str]
    embeddings: np.ndarray


@dataclass
class Candidate:
    """One mined negative: a row of the image or caption corpus and its embedding similarity."""

    row: int
    similarity: float
    itm_logit: Optional[float] = None


def load_caption_corpus(paths: Sequence[str], meta: TableMetadata, backbone=None) -> CaptionCorpus:
    """Captions from raw token tables (stored embeddings) and annotation JSON (embedded by `backbone`)."""
    captions, image_ids, vectors = [], [], []
    same = dict(backbone=meta.backbone, pretrained=meta.pretrained, feature_layer=meta.feature_layer, embed_dim=meta.embed_dim)
    for p in paths:
        if p.endswith(".json"):
            if backbone is None:
                raise ValueError(f"{p}: annotation captions need the backbone's text tower to embed them")
            ann = load_annotations(p)
            pairs = [(ann.image_ids[ann.caption_image[j]], c) for j, c in enumerate(ann.captions)]
            image_ids += [i for i, _ in pairs]
            captions += [c for _, c in pairs]
            vectors.append(embed_texts(backbone, [c for _, c in pairs]))
        else:
            table_meta = read_metadata(p)
            table_meta.check(p, **same)
            table, _ = read_token_tables([p], columns=["image_id", "caption", "text_embedding"], **same)
            image_ids += table.column("image_id").to_pylist()
            captions += table.column("caption").to_pylist()
            vectors.append(vector_matrix(table.column("text_embedding")))
    if not captions:
        raise ValueError(f"no captions in {list(paths)}")
    return CaptionCorpus(captions, image_ids, np.ascontiguousarray(np.concatenate(vectors), dtype=np.float32))


class HardNegativeMiner:
    """Corpus-wide nearest-neighbour negatives with the false-negative masks of training/mining.py."""

    def __init__(self, image_ids: Sequence[str], image_embeddings: np.ndarray, captions: CaptionCorpus,
                 index_factory: str = "Flat"):
        self.images = EmbeddingIndex(image_ids, image_embeddings, index_factory)
        self.image_embeddings = np.ascontiguousarray(image_embeddings, dtype=np.float32)
        self.image_row: Dict[str, int] = {i: r for r, i in enumerate(self.images.ids)}
        self.corpus = captions
        self.captions = EmbeddingIndex(captions.captions, captions.embeddings, index_factory)
        self.caption_row: Dict[str, int] = {}
        self.images_with_caption: Dict[str, Set[str]] = {}
        for r, (cap, img) in enumerate(zip(captions.captions, captions.image_ids)):
            self.caption_row.setdefault(cap, r)
            self.images_with_caption.setdefault(cap, set()).add(img)

    def missing_images(self, image_ids: Sequence[str]) -> List[str]:
        """Ids that are not in the image corpus (unique, in order)."""
        return list(dict.fromkeys(i for i in image_ids if i not in self.image_row))

    def caption_embeddings(self, captions: Sequence[str], backbone=None) -> np.ndarray:
        """Stored embeddings of known captions; the text tower embeds the others."""
        out = np.zeros((len(captions), self.captions.index.d), np.float32)
        unknown = [n for n, c in enumerate(captions) if c not in self.caption_row]
        for n, c in enumerate(captions):
            if c in self.caption_row:
                out[n] = self.corpus.embeddings[self.caption_row[c]]
        if unknown:
            if backbone is None:
                raise ValueError("captions outside the caption corpus need the backbone's text tower")
            out[unknown] = embed_texts(backbone, [captions[n] for n in unknown])
        return out

    def mine(self, image_ids: Sequence[str], captions: Sequence[str], text_embeddings: np.ndarray,
             want: int) -> Tuple[List[List[Candidate]], List[List[Candidate]]]:
        """Up to `want` negative images per caption and negative captions per image, best first."""
        image_emb = self.image_embeddings[[self.image_row[i] for i in image_ids]]

        def image_ok(n: int, row: int, chosen: list) -> bool:
            cand = self.images.ids[row]
            return cand != image_ids[n] and cand not in self.images_with_caption.get(captions[n], ())

        def caption_ok(n: int, row: int, chosen: list) -> bool:
            text = self.corpus.captions[row]
            return (self.corpus.image_ids[row] != image_ids[n] and text != captions[n]
                    and all(self.corpus.captions[c.row] != text for c in chosen))

        negative_images = _search_filtered(self.images, text_embeddings, want, image_ok)
        negative_captions = _search_filtered(self.captions, image_emb, want, caption_ok)
        return negative_images, negative_captions


def _search_filtered(index: EmbeddingIndex, queries: np.ndarray, want: int, ok) -> List[List[Candidate]]:
    """Nearest rows per query that pass `ok`, widening the search until `want` pass or the index is exhausted."""
    k = min(len(index), 2 * want + 8)
    while True:
        scores, rows = index.search(queries, k)
        picked: List[List[Candidate]] = []
        for n in range(len(queries)):
            chosen: List[Candidate] = []
            for r, s in zip(rows[n], scores[n]):
                if r < 0 or len(chosen) == want:
                    break
                if ok(n, int(r), chosen):
                    chosen.append(Candidate(int(r), float(s)))
            picked.append(chosen)
        if k >= len(index) or all(len(c) == want for c in picked):
            return picked
        k = min(len(index), 4 * k)


class Miner:
    """The hard-negative miner as a Serve deployment; rescoring goes through the reranker deployment."""

    def __init__(self, image_tables: Sequence[str], caption_sources: Sequence[str], index_factory: str = "Flat",
                 pretrained_override: Optional[str] = None, reranker=None, torch_threads: int = 1,
                 device: Optional[str] = None):
        from edje.model.device import pick_device

        torch.set_num_threads(max(1, torch_threads))
        self.device = pick_device(device)  # None: the GPU when this replica was given one
        ids, vectors, meta = read_image_embeddings(image_tables)
        self.backbone = load_backbone(meta, pretrained_override, self.device)
        corpus = load_caption_corpus(caption_sources, meta, self.backbone)
        self.miner = HardNegativeMiner(ids, vectors, corpus, index_factory)
        self.reranker = reranker
        self.summary = dict(images=len(ids), captions=len(corpus.captions), image_tables=list(image_tables),
                            caption_sources=list(caption_sources), backbone=meta.backbone, embed_dim=meta.embed_dim,
                            can_rescore=reranker is not None, device=str(self.device))
        # What was answered, for operators and tests: which client asked for which pairs, what it got.
        self.served: Deque[dict] = deque(maxlen=SERVED_LOG)
        self.requests = 0
        log.info("miner: %d images, %d captions, text tower on %s", len(ids), len(corpus.captions), self.device)

    def info(self) -> dict:
        """Corpus sizes and sources, requests answered."""
        return {**self.summary, "requests": self.requests}

    def image_of_caption(self, caption: str) -> Optional[str]:
        """The image a caption belongs to in the caption sources, when exactly one image has it; else None."""
        owners = self.miner.images_with_caption.get(caption) or self.miner.images_with_caption.get(caption.strip())
        return next(iter(owners)) if owners and len(owners) == 1 else None

    def recent(self) -> List[dict]:
        """The last answered requests: client, anchor image ids and captions, negative image ids and captions."""
        return list(self.served)

    async def negatives(self, image_ids: List[str], captions: List[str], k: int, rescore: bool = False,
                        pool: Optional[int] = None, client: Optional[str] = None) -> dict:
        """{'missing': [...]} for unknown images, else {'negatives': [...]} as in schemas.api.PairNegatives."""
        out = await self._negatives(image_ids, captions, k, rescore, pool)
        if "negatives" in out:
            self.requests += 1
            self.served.append(dict(client=client, image_ids=list(image_ids), captions=list(captions),
                                    negative_images=[[n["image_id"] for n in r["negative_images"]] for r in out["negatives"]],
                                    negative_captions=[[n["caption"] for n in r["negative_captions"]] for r in out["negatives"]]))
        return out

    async def _negatives(self, image_ids: List[str], captions: List[str], k: int, rescore: bool,
                         pool: Optional[int]) -> dict:
        missing = self.miner.missing_images(image_ids)
        if missing:
            return {"missing": missing}
        if rescore and self.reranker is None:
            return {"error": "rescore needs the joint encoder: this miner is served without a checkpoint"}
        want = max(pool or 4 * k, k) if rescore else k
        text_emb = self.miner.caption_embeddings(captions, self.backbone)
        neg_images, neg_captions = self.miner.mine(image_ids, captions, text_emb, want)
        if rescore:
            error = await self._rescore(image_ids, captions, neg_images, neg_captions, k)
            if error:
                return {"error": error}
        corpus, ids = self.miner.corpus, self.miner.images.ids
        return {"negatives": [
            dict(image_id=image_ids[n], caption=captions[n],
                 negative_images=[dict(image_id=ids[c.row], similarity=c.similarity, itm_logit=c.itm_logit)
                                  for c in neg_images[n][:k]],
                 negative_captions=[dict(caption=corpus.captions[c.row], image_id=corpus.image_ids[c.row],
                                         similarity=c.similarity, itm_logit=c.itm_logit) for c in neg_captions[n][:k]])
            for n in range(len(image_ids))]}

    async def _rescore(self, image_ids, captions, neg_images, neg_captions, k) -> Optional[str]:
        """Re-rank each pool by ITM logit in place (one reranker call for both directions)."""
        ids, corpus = self.miner.images.ids, self.miner.corpus
        texts, images, slots = [], [], []
        for n in range(len(image_ids)):
            for c in neg_images[n]:
                texts.append(captions[n]), images.append(ids[c.row]), slots.append(c)
            for c in neg_captions[n]:
                texts.append(corpus.captions[c.row]), images.append(image_ids[n]), slots.append(c)
        if not texts:
            return None
        scores = await self.reranker.score_pairs.remote(texts, images)
        if scores.missing:
            return f"rescore needs every candidate in the token store; not there: {scores.missing[:20]}"
        for c, logit in zip(slots, scores.logits):
            c.itm_logit = float(logit)
        for lists in (neg_images, neg_captions):
            for n in range(len(lists)):
                lists[n] = sorted(lists[n], key=lambda c: -c.itm_logit)[:k]
        return None
