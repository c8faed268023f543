"""Request and response models of the serving HTTP API (pydantic; FastAPI builds the OpenAPI schema from them).

`/v1/rerank` takes and returns Jina's rerank shape and `/v2/rerank` Cohere's, so that clients
written for those services work by changing only their base URL. Documents are image ids of
the served corpus. Unknown request fields are ignored (those clients send extras such as
`max_tokens_per_doc`). The request models are built from `ApiLimits` (`request_models`), so
the limits the server enforces (document count, text length, non-blank text, top_n >= 1) are
the ones its OpenAPI schema states: one configuration, validated by pydantic, documented by FastAPI.
"""
# No `from __future__ import annotations`: the models built inside request_models refer to local types.
import functools
from dataclasses import dataclass
from typing import Annotated, Any, Dict, List, Literal, Optional, Type, Union

from pydantic import BaseModel, ConfigDict, Field

NON_BLANK = r"\S"  # at least one non-whitespace character (JSON Schema patterns search, like pydantic's)
MAX_ID_CHARS = 512  # image ids are short keys; longer strings cannot be in the corpus
DOCUMENT_KEYS = ("id", "image_id", "image", "text")

ImageId = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS, pattern=NON_BLANK,
                               description="an image id of the served corpus")]


@dataclass(frozen=True)
class ApiLimits:
    """What the server accepts; request models (and so the OpenAPI schema) are built from it."""

    max_documents: int = 1000  # documents per rerank request, texts per text rerank
    max_text_chars: int = 2000  # characters of a query, text or caption
    max_pairs: int = 1024  # pairs per /v1/negatives request
    max_top_k: int = 1000  # first-stage candidates per /v1/search
    max_k: int = 256  # negatives per pair and direction
    max_pool: int = 1024  # embedding candidates per sample when rescoring
    can_rescore: bool = True  # False: /v1/negatives is served without a joint encoder


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class DocumentById(_Request):
    """A document object naming its image by `id` (Jina/Cohere style objects)."""

    id: ImageId


class DocumentByImageId(_Request):
    """A document object naming its image by `image_id`."""

    image_id: ImageId


class DocumentByImage(_Request):
    """A document object naming its image by `image`."""

    image: ImageId


class DocumentByText(_Request):
    """A document object whose `text` is the image id (what Jina's text documents carry)."""

    text: ImageId


DocumentRef = Union[ImageId, DocumentById, DocumentByImageId, DocumentByImage, DocumentByText]


def document_id(doc: Union[str, BaseModel, Dict[str, Any]]) -> str:
    """The image id a document names: the string itself or its id/image_id/image/text field, in that order."""
    if isinstance(doc, str):
        return doc
    fields = doc if isinstance(doc, dict) else doc.model_dump()
    for key in DOCUMENT_KEYS:
        if isinstance(fields.get(key), str):
            return fields[key]
    raise ValueError(f"a document object must carry one of {list(DOCUMENT_KEYS)} as a string")


@dataclass(frozen=True)
class RequestModels:
    """The request models of one served configuration."""

    rerank: Type[BaseModel]
    text_rerank: Type[BaseModel]
    search: Type[BaseModel]
    negatives: Type[BaseModel]


@functools.lru_cache(maxsize=None)
def request_models(limits: ApiLimits = ApiLimits()) -> RequestModels:
    """Request models whose constraints are `limits` (the server validates with them; OpenAPI shows them)."""
    Text = Annotated[str, Field(min_length=1, max_length=limits.max_text_chars, pattern=NON_BLANK)]

    class RerankRequest(_Request):
        """Rank image documents for a text query (Jina /v1/rerank and Cohere /v2/rerank requests)."""

        model: Optional[str] = Field(None, description="ignored beyond being echoed; the server serves one model")
        query: Text = Field(..., description="the text query")
        documents: List[DocumentRef] = Field(
            ..., min_length=1, max_length=limits.max_documents,
            description="image ids of the served corpus, as strings or objects with an 'id' (or 'image_id', 'image', "
                        "'text') field")
        top_n: Optional[int] = Field(None, ge=1, description="return only the best top_n (default: all)")
        return_documents: bool = Field(True, description="echo each document (its image id) in the results")
        raw_scores: bool = Field(False, description="relevance_score is the ITM logit instead of its sigmoid")

        def image_ids(self) -> List[str]:
            """The documents as image ids."""
            return [document_id(d) for d in self.documents]

    class TextRerankRequest(_Request):
        """Rank candidate texts for one image (image-to-text)."""

        model: Optional[str] = None
        image: ImageId
        texts: List[Text] = Field(..., min_length=1, max_length=limits.max_documents, description="candidate captions")
        top_n: Optional[int] = Field(None, ge=1)
        return_documents: bool = True
        raw_scores: bool = False

    class SearchRequest(_Request):
        """Text-to-image search: first stage top_k by embedding similarity, reranked, best top_n returned."""

        model: Optional[str] = None
        query: Text
        top_k: int = Field(10, ge=1, le=limits.max_top_k, description="first-stage candidates handed to the reranker")
        top_n: Optional[int] = Field(None, ge=1, description="results returned (default: top_k)")
        raw_scores: bool = False

    class Pair(_Request):
        """One positive image-caption pair of a training batch."""

        image_id: ImageId
        caption: Text

    rescore_type = bool if limits.can_rescore else Literal[False]

    class NegativesRequest(_Request):
        """Hard negatives for a batch of pairs from the whole corpus (what training asks for)."""

        pairs: List[Pair] = Field(..., min_length=1, max_length=limits.max_pairs)
        k: int = Field(4, ge=1, le=limits.max_k, description="negatives per caption and per image")
        rescore: rescore_type = Field(  # type: ignore[valid-type]
            False, description="re-rank a larger embedding pool by the joint encoder's ITM logit"
                               + ("" if limits.can_rescore else " (not served here: no checkpoint)"))
        pool: Optional[int] = Field(None, ge=1, le=limits.max_pool,
                                    description="embedding candidates per sample when rescoring (default 4k)")

    return RequestModels(RerankRequest, TextRerankRequest, SearchRequest, NegativesRequest)


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
