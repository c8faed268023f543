"""EDJEReranker: load a checkpoint folder and rerank images for a text in-process, shaped like sentence-transformers'
CrossEncoder (`from_pretrained`, `predict`, `rank`).

It runs the same code as the encode job (model/token_encoder.py: backbone -> adapter -> codec) and
as evaluation and serving (model/scoring.py: ITM logits, the checkpoint's fusion and calibration).
No Ray. A checkpoint is a local folder or a Hugging Face Hub repository id (`huggingface_hub`, offline from
its cache); the backbone weights the checkpoint records are found by `edje.schemas.weights.find_weights`
(beside the checkpoint, in the working directory or the repository, or as an open_clip tag).
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image

from edje.model.device import pick_device
from edje.model.edje import read_checkpoint_config
from edje.model.ranking import write_ranking
from edje.model.scoring import PairScorer
from edje.model.token_encoder import EncodedImages, TokenEncoder
from edje.schemas.config import BackboneConfig, CodecConfig, EDJEConfig, from_dict
from edje.schemas.token_table import TableMetadata
from edje.schemas.weights import find_weights
from edje.storage.hub import checkpoint_folder

# What a document may be: an image (PIL, bytes, a file path, an http(s) url) or an id of an opened token table.
Document = Union[Image.Image, bytes, str, os.PathLike]
BACKBONE_DIR = "backbone"
MAX_IMAGE_PIXELS = 40_000_000


class UnknownDocument(ValueError):
    """A document that is neither an image nor an id of the opened token tables."""


def _carry_weights(path: Optional[str], out: Path) -> Optional[str]:
    """Copy a local weights file into `out`'s backbone folder; its path relative to `out`, so that it travels with
    the folder (None: not a local file)."""
    if not path or not os.path.isfile(path):
        return None
    (out / BACKBONE_DIR).mkdir(exist_ok=True)
    shutil.copy2(path, out / BACKBONE_DIR / Path(path).name)
    return f"{BACKBONE_DIR}/{Path(path).name}"


class EDJEReranker:
    """A reranker over images: `rank(query, documents)` orders images (or stored ids) for a text."""

    def __init__(self, path: str, scorer: PairScorer, backbone: BackboneConfig, quant: str = "int8",
                 group_size: Optional[int] = None):
        self.path, self.scorer, self.backbone_config = path, scorer, backbone
        self.quant, self.group_size = quant, group_size
        self._encoder: Optional[TokenEncoder] = None
        self._tables: Optional[Any] = None  # serving.token_store.TokenStore of open_tables

    # ----- loading and saving -------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model_name_or_path: Union[str, os.PathLike], device: Optional[str] = None,
                        precision: str = "fp32", quant: str = "int8", group_size: Optional[int] = None,
                        batch_size: int = 256, max_length: Optional[int] = None, revision: Optional[str] = None,
                        cache_folder: Optional[str] = None) -> "EDJEReranker":
        """Load a checkpoint (a folder or a hub id); images are stored as `quant` tokens (the encode job's default
        int8) before scoring; queries keep at most `max_length` wordpieces (default and ceiling: the checkpoint's)."""
        path = checkpoint_folder(model_name_or_path, revision, cache_folder)
        cfg = from_dict(EDJEConfig, read_checkpoint_config(path)["config"])
        backbone = dataclasses.replace(cfg.backbone, pretrained=find_weights(cfg.backbone.pretrained, checkpoint=path))
        scorer = PairScorer.from_checkpoint(path, pick_device(device), precision, batch_size)
        CodecConfig(quant, group_size)  # refuse an unknown codec now, not at the first image
        reranker = cls(path, scorer, backbone, quant, group_size)
        if max_length is not None:
            reranker.max_length = max_length
        return reranker

    @property
    def max_length(self) -> int:
        """Wordpieces of a query the joint encoder reads; longer queries are cut (CrossEncoder's `max_length`)."""
        enc = self.scorer.model.encoder
        return enc.text_limit or enc.config.max_text_tokens

    @max_length.setter
    def max_length(self, n: int) -> None:
        ceiling = self.scorer.model.encoder.config.max_text_tokens
        if not 1 <= n <= ceiling:
            raise ValueError(f"max_length must be in 1..{ceiling} (the text positions this checkpoint was trained "
                             f"with), got {n}")
        self.scorer.model.encoder.text_limit = None if n == ceiling else n

    def save_pretrained(self, directory: Union[str, os.PathLike]) -> str:
        """Write a folder that `from_pretrained` reads back bit for bit: the checkpoint's files and its backbone weights."""
        out = Path(directory)
        if out.resolve() == Path(self.path).resolve():
            raise ValueError(f"save_pretrained would overwrite the folder it was loaded from: {out}")
        shutil.copytree(self.path, out, dirs_exist_ok=True)
        carried = _carry_weights(self.backbone_config.pretrained, out)
        if carried:
            meta = json.loads((out / "config.json").read_text())
            meta["config"]["backbone"]["pretrained"] = carried
            (out / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        towers = self.ranking.query_towers  # the rule's query towers travel the same way
        if towers:
            towers = tuple(dataclasses.replace(t, pretrained=_carry_weights(
                find_weights(t.pretrained, checkpoint=self.path), out) or t.pretrained) for t in towers)
            write_ranking(str(out), dataclasses.replace(self.ranking, query_towers=towers))
        return str(out)

    # ----- images ------------------------------------------------------------------------------------------
    @property
    def encoder(self) -> TokenEncoder:
        """The backbone -> adapter -> codec step (built at first use: ids of stored tables need no backbone)."""
        if self._encoder is None:
            self._encoder = TokenEncoder.create(self.backbone_config, self.scorer.model.adapter,
                                                CodecConfig(self.quant, self.group_size), self.scorer.device)
            # The rule's cosine is the first stage's: the query towers it was fitted with join the text tower.
            self._encoder.backbone.join_query_towers(self.scorer.ranking.query_towers, self.path)
        return self._encoder

    def encode_images(self, images: Sequence[Document], batch_size: int = 64) -> EncodedImages:
        """Images (PIL, paths, urls, bytes) -> stored-token rows: the bytes the encode job writes for them."""
        from edje.model.image_decode import decode_image

        pp = self.encoder.backbone.preprocess
        parts = []
        for i in range(0, len(images), batch_size):
            pixels = np.stack([decode_image(image_bytes(x), pp.size, pp.resize_mode, MAX_IMAGE_PIXELS)
                               for x in images[i:i + batch_size]])
            parts.append(self.encoder.encode(pixels))
        if not parts:
            raise ValueError("encode_images needs at least one image")
        return EncodedImages(np.concatenate([p.blob for p in parts]),
                             None if parts[0].scales is None else np.concatenate([p.scales for p in parts]),
                             np.concatenate([p.embeddings for p in parts]))

    def open_tables(self, paths: Sequence[str]) -> "EDJEReranker":
        """Open compressed token tables (the encode job's output for this checkpoint): their ids become documents."""
        from edje.storage.token_store import TokenStore

        self._tables = TokenStore.load(list(paths), read_checkpoint_config(self.path))
        return self

    # ----- scoring -----------------------------------------------------------------------------------------
    def predict(self, pairs: Sequence[Tuple[str, Document]], calibrated: bool = False,
                first_stage_scores: Optional[Sequence[float]] = None, batch_size: Optional[int] = None,
                show_progress_bar: Optional[bool] = None) -> np.ndarray:
        """ITM logits of (text, document) pairs; with calibrated=True the probability that each pair matches
        (the checkpoint's rule, fused with the first-stage cosine when it fuses, then its Platt scaling)."""
        if not pairs:
            return np.zeros(0, np.float32)
        texts = [_text(t) for t, _ in pairs]
        rows, meta = self._document_rows([d for _, d in pairs])
        logits = self._logits(meta, texts, rows, batch_size, show_progress_bar)
        if not calibrated:
            return logits
        return self.scorer.relevance(self._scores(texts, logits, rows.embeddings, first_stage_scores))

    def rank(self, query: str, documents: Sequence[Document], top_k: Optional[int] = None,
             return_documents: bool = False, first_stage_scores: Optional[Sequence[float]] = None,
             batch_size: Optional[int] = None, show_progress_bar: Optional[bool] = None) -> List[Dict]:
        """Documents ordered by the checkpoint's ranking rule: [{corpus_id, score, relevance[, text]}], best first
        (`text`: the document itself, under the key CrossEncoder.rank gives it).
        `first_stage_scores` (one per document) are used when the rule fuses; without them the backbone's towers
        compute the cosine."""
        if not documents:
            return []
        query = _text(query)
        texts = [query] * len(documents)
        rows, meta = self._document_rows(documents)
        logits = self._logits(meta, texts, rows, batch_size, show_progress_bar)
        scores = self._scores(texts, logits, rows.embeddings, first_stage_scores)
        relevance = self.scorer.relevance(scores)
        order = np.argsort(-scores, kind="stable")[:top_k]
        out = []
        for i in order:
            row = {"corpus_id": int(i), "score": float(scores[i]), "relevance": float(relevance[i])}
            if return_documents:
                row["text"] = documents[i]  # CrossEncoder.rank's key, so callers written for it read it
            out.append(row)
        return out

    @property
    def ranking(self):
        """The checkpoint's ranking rule (model/ranking.py RankingConfig)."""
        return self.scorer.ranking

    # ----- internals ---------------------------------------------------------------------------------------
    def _logits(self, meta: TableMetadata, texts: List[str], rows: EncodedImages, batch_size: Optional[int],
                show_progress_bar: Optional[bool]) -> np.ndarray:
        """ITM logits of the pairs in batches of `batch_size`, with a progress bar when asked (CrossEncoder's flags)."""
        bar = None
        if show_progress_bar:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(texts), desc="pairs", unit="pair")
        try:
            return self.scorer.blob_logits(meta, texts, rows.blob, rows.scales, batch_size=batch_size,
                                           progress=None if bar is None else lambda done: bar.update(done - bar.n))
        finally:
            if bar is not None:
                bar.close()

    def _scores(self, texts: List[str], logits: np.ndarray, embeddings: np.ndarray,
                first_stage_scores: Optional[Sequence[float]]) -> np.ndarray:
        if not self.scorer.ranking.fuses:
            return logits
        if first_stage_scores is None:
            unique = list(dict.fromkeys(texts))
            emb = self.encoder.encode_text(unique)
            row = {t: i for i, t in enumerate(unique)}
            sim = np.einsum("ij,ij->i", emb[[row[t] for t in texts]], embeddings)
        else:
            sim = np.asarray(first_stage_scores, dtype=np.float32)
            if sim.shape != logits.shape:
                raise ValueError(f"{len(logits)} documents but {sim.size} first-stage scores")
        return self.scorer.scores(logits, sim, queries=texts)  # a switched rule reads each text's best candidate

    def _document_rows(self, documents: Sequence[Document]) -> Tuple[EncodedImages, TableMetadata]:
        """Stored rows of the documents (ids gathered from the opened tables, images encoded once each)."""
        ids, images = {}, {}
        for i, d in enumerate(documents):
            if isinstance(d, str) and self._tables is not None and self._is_id(d):
                ids[i] = d
            else:
                images[i] = d
        meta = self._meta()
        n = len(documents)
        parts: Dict[int, Tuple[np.ndarray, Optional[np.ndarray], np.ndarray]] = {}
        if ids:
            got = self._tables.gather_blobs(list(ids.values()))
            if got.missing:
                raise UnknownDocument(f"unknown image ids: {got.missing}")
            emb = self._tables.embeddings_of(list(ids.values()))
            for j, i in enumerate(ids):
                parts[i] = (got.blob[j], None if got.scales is None else got.scales[j], emb[j])
        if images:
            enc = self.encode_images([images[i] for i in images])
            for j, i in enumerate(images):
                parts[i] = (enc.blob[j], None if enc.scales is None else enc.scales[j], enc.embeddings[j])
        blob = np.stack([parts[i][0] for i in range(n)])
        scales = None if parts[0][1] is None else np.stack([parts[i][1] for i in range(n)])
        return EncodedImages(blob, scales, np.stack([parts[i][2] for i in range(n)]).astype(np.float32)), meta

    def _is_id(self, document: str) -> bool:
        rows, _ = self._tables.rows([document])
        return bool(rows[0] >= 0)

    def _meta(self) -> TableMetadata:
        """The stored-row layout documents are scored in: the opened tables', else this reranker's codec."""
        if self._tables is not None:
            meta = self._tables.meta
            if meta.quantization != self.quant or meta.group_size != self.group_size:
                # Images must be stored like the table's rows, so that a document scores the same either way.
                self.quant, self.group_size, self._encoder = meta.quantization, meta.group_size, None
            return meta
        enc = self.encoder
        b = self.backbone_config
        return TableMetadata(kind="compressed", backbone=b.name, pretrained=b.pretrained, feature_layer=b.feature_layer,
                             num_tokens=enc.num_tokens, width=enc.width, quantization=self.quant,
                             embed_dim=int(enc.backbone.embed_dim), group_size=self.group_size,
                             adapter_hash=self.scorer.model.adapter_hash())


def image_bytes(document: Document) -> bytes:
    """Encoded bytes of an image document: PIL image, bytes, a file path or an http(s) url."""
    if isinstance(document, Image.Image):
        buf = io.BytesIO()
        document.convert("RGB").save(buf, format="PNG")
        return buf.getvalue()
    if isinstance(document, (bytes, bytearray, memoryview)):
        return bytes(document)
    if isinstance(document, (str, os.PathLike)):
        s = os.fspath(document)
        if s.startswith(("http://", "https://")):
            import httpx

            r = httpx.get(s, timeout=30, follow_redirects=True)
            r.raise_for_status()
            return r.content
        if os.path.isfile(s):
            return Path(s).read_bytes()
        raise UnknownDocument(f"{s[:200]!r} is not an image file, an http(s) url or an id of the opened token tables")
    raise TypeError(f"a document must be a PIL image, bytes, a path, a url or a table id, got {type(document).__name__}")


def _text(text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a query must be a non-empty string, got {text!r}")
    return text
