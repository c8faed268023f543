"""Request and response models of the serving HTTP API (pydantic; FastAPI builds the OpenAPI schema from them).

`/v1/rerank` takes and returns Jina's rerank shape and `/v2/rerank` Cohere's, so that clients
written for those services work by changing only their base URL. Documents are image ids of
the served corpus. Unknown request fields are ignored (those clients send extras such as
`max_tokens_per_doc`); limits that the server configures (document count, text length) are
checked by the ingress, not here, so that they can change without changing the schema.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

DOCUMENT_KEYS = ("id", "image_id", "image", "text")


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _non_blank(value: str, what: str) -> str:
    if not value or not value.strip():
        raise ValueError(f"{what} must be a non-empty string")
    return value


def document_id(doc: Union[str, Dict[str, Any]]) -> str:
    """The image id a document names: the string itself or its id/image_id/image/text field."""
    if isinstance(doc, str):
        return doc
    for key in DOCUMENT_KEYS:
        if isinstance(doc.get(key), str):
            return doc[key]
    raise ValueError(f"a document object must carry one of {list(DOCUMENT_KEYS)} as a string")


class RerankRequest(_Request):
    """Rank image documents for a text query (Jina /v1/rerank and Cohere /v2/rerank requests)."""

    model: Optional[str] = Field(None, description="ignored beyond being echoed; the server serves one model")
    query: str = Field(..., description="the text query")
    documents: List[Union[str, Dict[str, Any]]] = Field(
        ..., description="image ids of the served corpus, as strings or objects with an 'id' (or 'image_id', "
                         "'image', 'text') field")
    top_n: Optional[int] = Field(None, ge=1, description="return only the best top_n (default: all)")
    return_documents: bool = Field(True, description="echo each document (its image id) in the results")
    raw_scores: bool = Field(False, description="relevance_score is the ITM logit instead of its sigmoid")

    @field_validator("query")
    @classmethod
    def _query(cls, v: str) -> str:
        return _non_blank(v, "query")

    @field_validator("documents")
    @classmethod
    def _documents(cls, v: list) -> list:
        if not v:
            raise ValueError("documents must not be empty")
        for doc in v:
            _non_blank(document_id(doc), "every document id")
        return v

    def image_ids(self) -> List[str]:
        """The documents as image ids."""
        return [document_id(d) for d in self.documents]


class TextRerankRequest(_Request):
    """Rank candidate texts for one image (image-to-text)."""

    model: Optional[str] = None
    image: str = Field(..., description="an image id of the served corpus")
    texts: List[str] = Field(..., description="candidate captions")
    top_n: Optional[int] = Field(None, ge=1)
    return_documents: bool = True
    raw_scores: bool = False

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        return _non_blank(v, "image")

    @field_validator("texts")
    @classmethod
    def _texts(cls, v: list) -> list:
        if not v:
            raise ValueError("texts must not be empty")
        for t in v:
            _non_blank(t, "every text")
        return v


class SearchRequest(_Request):
    """Text-to-image search: first stage top_k by embedding similarity, reranked, best top_n returned."""

    model: Optional[str] = None
    query: str
    top_k: int = Field(10, ge=1, description="first-stage candidates handed to the reranker")
    top_n: Optional[int] = Field(None, ge=1, description="results returned (default: top_k)")
    raw_scores: bool = False

    @field_validator("query")
    @classmethod
    def _query(cls, v: str) -> str:
        return _non_blank(v, "query")


class Pair(_Request):
    """One positive image-caption pair of a training batch."""

    image_id: str
    caption: str

    @field_validator("image_id", "caption")
    @classmethod
    def _fields(cls, v: str) -> str:
        return _non_blank(v, "image_id and caption")


class NegativesRequest(_Request):
    """Hard negatives for a batch of pairs from the whole corpus (what training asks for)."""

    pairs: List[Pair]
    k: int = Field(4, ge=1, le=256, description="negatives per caption and per image")
    rescore: bool = Field(False, description="re-rank a larger embedding pool by the joint encoder's ITM logit")
    pool: Optional[int] = Field(None, ge=1, le=1024, description="embedding candidates per sample when rescoring (default 4k)")

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v: list) -> list:
        if not v:
            raise ValueError("pairs must not be empty")
        return v


# ----------------------------------------------------------------------------- responses
class Document(BaseModel):
    """An echoed document: the image id (or text) as `text`, and the image's source url when known."""

    text: str
    url: Optional[str] = None


class RerankResult(BaseModel):
    index: int = Field(..., description="position of the document in the request")
    document: Optional[Document] = None
    relevance_score: float


class Usage(BaseModel):
    total_tokens: int = Field(..., description="joint-encoder positions per pair summed: caption words (approximating "
                              "wordpieces, capped at max_text_tokens) + image tokens + 3 special tokens")


class RerankResponse(BaseModel):
    """Jina's /v1/rerank response shape, sorted by relevance_score, best first."""

    model: str
    results: List[RerankResult]
    usage: Usage


class CohereResult(BaseModel):
    index: int
    relevance_score: float


class CohereMeta(BaseModel):
    api_version: Dict[str, str] = {"version": "2"}
    billed_units: Dict[str, int] = {"search_units": 1}


class CohereRerankResponse(BaseModel):
    """Cohere's /v2/rerank response shape."""

    id: str
    results: List[CohereResult]
    meta: CohereMeta = CohereMeta()


class SearchResult(BaseModel):
    image_id: str
    relevance_score: float
    first_stage_score: float = Field(..., description="cosine similarity of the pooled embeddings")
    url: Optional[str] = None


class SearchResponse(BaseModel):
    model: str
    results: List[SearchResult]
    usage: Usage


class NegativeImage(BaseModel):
    image_id: str
    similarity: float = Field(..., description="cosine(caption embedding, image embedding)")
    itm_logit: Optional[float] = Field(None, description="set when rescored by the joint encoder")


class NegativeCaption(BaseModel):
    caption: str
    image_id: str = Field(..., description="the image this caption belongs to in the caption corpus")
    similarity: float
    itm_logit: Optional[float] = None


class PairNegatives(BaseModel):
    image_id: str
    caption: str
    negative_images: List[NegativeImage] = Field(..., description="hardest negative images for the caption")
    negative_captions: List[NegativeCaption] = Field(..., description="hardest negative captions for the image")


class NegativesResponse(BaseModel):
    k: int
    rescored: bool
    negatives: List[PairNegatives]


class TableInfo(BaseModel):
    paths: List[str]
    metadata: Dict[str, Any]
    images: int
    memory_bytes: int


class InfoResponse(BaseModel):
    model: str
    checkpoint: Optional[str]
    adapter_hash: Optional[str]
    edje_config: Optional[Dict[str, Any]] = Field(None, description="the checkpoint's EDJEConfig")
    token_store: Optional[TableInfo]
    corpus_size: int
    miner: Optional[Dict[str, Any]]
    limits: Dict[str, Any]
    precision: Optional[str]


class Health(BaseModel):
    status: str
