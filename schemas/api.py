"""Request and response models of the serving HTTP API (pydantic; FastAPI builds the OpenAPI schema from them).

`/v1/rerank` takes and returns Jina's rerank shape and `/v2/rerank` Cohere's, so that clients
written for those services work by changing only their base URL. Documents are image ids of
the served corpus. A document object's `image` may also carry the image itself (an http(s)
url, a `data:` url or base64 bytes; `image_source`), and a plain string that is an http(s) url is an
image url (`document_ref`). A text document (`{"text": ...}` alone, Jina's and Cohere's v1 shape) is
refused (422, TEXT_DOCUMENT): this server ranks images, and reading the text as an image id would answer a
misleading 404. Unknown request fields are refused (422 naming them), except the fields real clients send
that mean nothing for images, which are declared and documented as ignored (IGNORED_FIELDS). A text longer
than the joint encoder reads (max_text_tokens wordpieces) is cut when `truncate` is true (the default, as in
Hugging Face TEI's /rerank; the response's `meta.truncated` says so) and refused with 413 when false.
The request models are built from `ApiLimits` (`request_models`), so the limits the server enforces (document
count, text length, non-blank text, top_n >= 1) are the ones its OpenAPI schema states: one configuration,
validated by pydantic, documented by FastAPI.
`/v1/search` searches by a text, by a corpus image id, or by both (mixed-modal: the image and a text that
modifies it; `SearchRequest`).
"""
# No `from __future__ import annotations`: the models built inside request_models refer to local types.
import functools
import math
from dataclasses import dataclass
from typing import Annotated, Any, Dict, List, Literal, Optional, Tuple, Type, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

NON_BLANK = r"\S"  # at least one non-whitespace character (JSON Schema patterns search, like pydantic's)
MAX_ID_CHARS = 512  # image ids are short keys; longer strings cannot be in the corpus
MAX_URL_CHARS = 2048
URL_PATTERN = r"^https?://\S+$"
DOCUMENT_KEYS = ("id", "image_id", "image")  # what names a document object's image, in the order read
TEXT_DOCUMENT = ("this server ranks images: send a corpus image id as {'id': ...} or a plain string, "
                 "or an image as {'image': url | base64}")
# Fields that Jina, Cohere (SDK v1 and v2) and TEI clients send and that mean nothing for image documents: declared
# on the rerank request (so that OpenAPI documents them) and ignored. Any other unknown field is a 422.
IGNORED_FIELDS = {
    "max_tokens_per_doc": "Cohere v2: documents are images, never cut into tokens",
    "priority": "Cohere v2: requests are served in arrival order",
    "rank_fields": "Cohere v1: document objects name an image, there are no text fields to rank on",
    "max_chunks_per_doc": "Cohere v1: an image document is one chunk, never split (`max_chunks` is not accepted)",
    "return_text": "TEI: documents are echoed by `return_documents`",
}
# Mixed-modal search: the image's share of the first-stage query (the text has the rest). Both embeddings are unit
# vectors of one joint space, so 0.5 weighs the two directions alike (the "image + text" sum baseline of composed
# image retrieval); benchmarks/mixed_modal.py measures it.
DEFAULT_IMAGE_WEIGHT = 0.5

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
    max_image_bytes: int = 10_000_000  # one image (url body or decoded base64)
    max_image_pixels: int = 40_000_000  # width x height of one decoded image
    max_image_documents: int = 16  # inline images per rerank request

    @property
    def max_image_chars(self) -> int:
        """Characters of an image as base64 text (4 per 3 bytes) plus room for a data: url prefix."""
        return 4 * math.ceil(self.max_image_bytes / 3) + 64


class _Request(BaseModel):
    # Unknown fields are refused: a misspelt or unsupported option must not be silently dropped.
    model_config = ConfigDict(extra="forbid")


class _DocumentObject(_Request):
    """A document object: names one image; a `text` beside it is accepted and ignored."""

    text: Optional[str] = Field(None, description="ignored: the image is what is ranked (a document with only a "
                                                  "text is refused: this server ranks images)")


class DocumentById(_DocumentObject):
    """A document object naming its image by `id` (Jina/Cohere style objects)."""

    id: ImageId


class DocumentByImageId(_DocumentObject):
    """A document object naming its image by `image_id`."""

    image_id: ImageId


def check_document_object(value: Any) -> Any:
    """Refuse, before the document union is tried (whose errors would list every member), a document object that
    names no image (a text document), names it twice, or has unknown fields; one message each."""
    if not isinstance(value, dict):
        return value
    unknown = sorted(set(value) - {*DOCUMENT_KEYS, "text"})
    named = [k for k in DOCUMENT_KEYS if k in value]
    if unknown:
        message = f"unknown document fields {unknown}: a document object is {{'id' | 'image_id' | 'image': ...}}"
    elif not named:
        message = TEXT_DOCUMENT if "text" in value else "a document object names its image by 'id', 'image_id' or 'image'"
    elif len(named) > 1:
        message = f"a document object names its image once: one of 'id', 'image_id', 'image', got {named}"
    else:
        return value
    # "{message}" as the template: the message's own braces are not read as placeholders.
    raise PydanticCustomError("document_shape", "{message}", {"message": message})


def image_source(value: str) -> Tuple[str, str]:
    """What a document's `image` string is: ('url', u) for http(s) urls, ('base64', b) for a data: url or a
    string longer than an id can be, else ('id', value)."""
    if value.startswith(("http://", "https://")):
        return "url", value
    if value.startswith("data:"):
        return "base64", value.split(",", 1)[1] if "," in value else ""
    if len(value) > MAX_ID_CHARS:
        return "base64", value
    return "id", value


def document_ref(doc: Union[str, BaseModel, Dict[str, Any]]) -> Tuple[str, str]:
    """('id', image id) for documents naming a corpus image; ('url' | 'base64', value) for inline images.
    A plain string that is an http(s) url is an image url: what clients that send documents as strings
    (Cohere's SDK, LangChain's CohereRerank) can say of an image outside the corpus."""
    if isinstance(doc, str):
        return ("url", doc) if doc.startswith(("http://", "https://")) else ("id", doc)
    fields = doc if isinstance(doc, dict) else doc.model_dump()
    for key in DOCUMENT_KEYS:
        if isinstance(fields.get(key), str):
            return image_source(fields[key]) if key == "image" else ("id", fields[key])
    raise ValueError(f"a document object must carry one of {list(DOCUMENT_KEYS)} as a string")


def document_id(doc: Union[str, BaseModel, Dict[str, Any]]) -> str:
    """The image id a document names: the string itself or its id/image_id/image field, in that order."""
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
    add_image: Type[BaseModel]


@functools.lru_cache(maxsize=None)
def request_models(limits: ApiLimits = ApiLimits()) -> RequestModels:
    """Request models whose constraints are `limits` (the server validates with them; OpenAPI shows them)."""
    Text = Annotated[str, Field(min_length=1, max_length=limits.max_text_chars, pattern=NON_BLANK)]
    ImageData = Annotated[str, Field(min_length=1, max_length=limits.max_image_chars, pattern=NON_BLANK,
                                     description=f"base64 image bytes (at most {limits.max_image_bytes} bytes) or a "
                                                 "data: url")]
    Url = Annotated[str, Field(min_length=8, max_length=MAX_URL_CHARS, pattern=URL_PATTERN,
                               description=f"http(s) url of an image (at most {limits.max_image_bytes} bytes)")]

    class DocumentByImage(_DocumentObject):
        """A document object whose `image` is an image id, an http(s) url, a data: url or base64 image bytes
        (a string longer than an id can be)."""

        image: Annotated[str, Field(min_length=1, max_length=limits.max_image_chars, pattern=NON_BLANK)]

    # Url after ImageId: a bare url string longer than an id can be is still a document.
    Document = Annotated[Union[ImageId, Url, DocumentById, DocumentByImageId, DocumentByImage],
                         BeforeValidator(check_document_object)]

    def truncate_field(what: str):
        """The `truncate` option (Hugging Face TEI's): cut an over-long text, or refuse it with 413."""
        return Field(True, description=f"{what} longer than the joint encoder reads (the checkpoint's max_text_tokens "
                                       "wordpieces, shown by GET /v1/info) is cut to its first max_text_tokens "
                                       "wordpieces, and the response's meta.truncated says so; false: refused with 413")

    class RerankRequest(_Request):
        """Rank image documents for a text query (Jina /v1/rerank and Cohere /v2/rerank requests)."""

        model: Optional[str] = Field(None, description="ignored beyond being echoed; the server serves one model")
        query: Text = Field(..., description="the text query")
        documents: List[Document] = Field(
            ..., min_length=1, max_length=limits.max_documents,
            description="image ids of the served corpus, as strings or objects with an 'id' (or 'image_id', 'image', "
                        "'text') field; {'image': url | base64} documents, and strings that are http(s) urls, are "
                        "images scored directly (at most "
                        f"{limits.max_image_documents} a request, each at most {limits.max_image_bytes} bytes and "
                        f"{limits.max_image_pixels} pixels)")
        top_n: Optional[int] = Field(None, ge=1, description="return only the best top_n (default: all)")
        return_documents: bool = Field(True, description="echo each document (its image id) in the results")
        raw_scores: bool = Field(False, description="relevance_score is the uncalibrated ranking score (ITM logit, "
                                                    "+ w x first-stage cosine when the rule fuses) instead of the "
                                                    "calibrated probability")
        truncate: bool = truncate_field("a query")
        # Sent by other services' clients, meaningless for images: accepted and ignored (IGNORED_FIELDS).
        max_tokens_per_doc: Optional[int] = Field(None, description="ignored (" + IGNORED_FIELDS["max_tokens_per_doc"] + ")")
        priority: Optional[int] = Field(None, description="ignored (" + IGNORED_FIELDS["priority"] + ")")
        rank_fields: Optional[List[str]] = Field(None, description="ignored (" + IGNORED_FIELDS["rank_fields"] + ")")
        max_chunks_per_doc: Optional[int] = Field(None, description="ignored (" + IGNORED_FIELDS["max_chunks_per_doc"] + ")")
        return_text: Optional[bool] = Field(None, description="ignored (" + IGNORED_FIELDS["return_text"] + ")")
        truncation_direction: Literal["right", "Right"] = Field(
            "right", description="TEI: which end of an over-long text is cut; only the right end (the joint encoder "
                                 "reads a text's first wordpieces)")

        @model_validator(mode="after")
        def _few_images(self):
            inline = sum(document_ref(d)[0] != "id" for d in self.documents)
            if inline > limits.max_image_documents:
                raise ValueError(f"documents: at most {limits.max_image_documents} image documents (url or base64) "
                                 f"a request, got {inline}")
            return self

        def image_ids(self) -> List[str]:
            """The documents as image ids."""
            return [document_id(d) for d in self.documents]

        def refs(self) -> List[Tuple[str, str]]:
            """The documents as (kind, value): ('id', image id) or ('url' | 'base64', the image)."""
            return [document_ref(d) for d in self.documents]

    class TextRerankRequest(_Request):
        """Rank candidate texts for one image (image-to-text)."""

        model: Optional[str] = None
        image: ImageId
        texts: List[Text] = Field(..., min_length=1, max_length=limits.max_documents, description="candidate captions")
        top_n: Optional[int] = Field(None, ge=1)
        return_documents: bool = True
        raw_scores: bool = False
        truncate: bool = truncate_field("a text")

    class SearchRequest(_Request):
        """Search the corpus: first stage top_k by embedding similarity, reranked, best top_n returned. The query is
        a text (text-to-image), a corpus image plus a text that modifies it (mixed-modal: "the same, but the circle
        is red"), or a corpus image alone (image-to-image: first stage only, nothing to rerank against)."""

        model: Optional[str] = None
        query: Optional[Text] = Field(None, description="the text query; with `image`, the text the results should "
                                                        "match (the reranker scores it against each candidate)")
        image: Optional[ImageId] = Field(None, description="an image id of the served corpus to search from; never "
                                                           "among its own results")
        image_weight: float = Field(
            DEFAULT_IMAGE_WEIGHT, ge=0.0, le=1.0,
            description="with both `query` and `image`: the image's share w of the first-stage query "
                        "normalise(w x image embedding + (1 - w) x text embedding); ignored otherwise")
        top_k: int = Field(10, ge=1, le=limits.max_top_k, description="first-stage candidates handed to the reranker")
        top_n: Optional[int] = Field(None, ge=1, description="results returned (default: top_k)")
        raw_scores: bool = False
        truncate: bool = truncate_field("a query")
        return_first_stage: bool = Field(False, description="also return all top_k candidates in first-stage order "
                                                            "(`first_stage`), e.g. to show the order before reranking")

        @model_validator(mode="after")
        def _something_to_search_by(self):
            if self.query is None and self.image is None:
                raise ValueError("give a 'query', an 'image' (a corpus image id) or both")
            return self

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

    class AddImageRequest(_Request):
        """Add one image to the served corpus: a url or base64 bytes, and optionally its id."""

        url: Optional[Url] = None
        image: Optional[ImageData] = None
        id: Optional[ImageId] = Field(None, description="the new image id (default: 'live-' + 16 hex digits of the "
                                                        "image's sha256); 409 when taken")

        @model_validator(mode="after")
        def _one_source(self):
            if (self.url is None) == (self.image is None):
                raise ValueError("give exactly one of 'url' and 'image' (base64)")
            return self

    return RequestModels(RerankRequest, TextRerankRequest, SearchRequest, NegativesRequest, AddImageRequest)


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
    total_tokens: int = Field(..., description="joint-encoder positions per pair summed: the text's wordpieces (the "
                              "checkpoint's tokenizer, at most max_text_tokens) + image tokens + 3 special tokens")


class TruncatedText(BaseModel):
    index: int = Field(..., description="position of the text in the request's `texts`")
    tokens: int = Field(..., description="its wordpieces")


class Truncation(BaseModel):
    """What `truncate: true` cut: the joint encoder read only the first `kept` wordpieces of these texts."""

    kept: int = Field(..., description="wordpieces of a text the joint encoder reads (the checkpoint's max_text_tokens)")
    query_tokens: Optional[int] = Field(None, description="the query's wordpieces, when there were more than `kept`")
    texts: Optional[List[TruncatedText]] = Field(None, description="/v1/rerank/texts: the texts longer than `kept`")


class ResponseMeta(BaseModel):
    """Present only when there is something to say: what was truncated, in words and as figures."""

    truncated: Optional[Truncation] = None
    warnings: Optional[List[str]] = None


class RerankResponse(BaseModel):
    """Jina's /v1/rerank response shape, sorted by relevance_score, best first (`meta` only when a text was cut)."""

    model: str
    results: List[RerankResult]
    usage: Usage
    meta: Optional[ResponseMeta] = None


class CohereResult(BaseModel):
    index: int
    relevance_score: float


class CohereMeta(BaseModel):
    """Cohere's meta (its SDK keeps fields it does not know): `warnings` is Cohere's own, `truncated` ours."""

    api_version: Dict[str, str] = {"version": "2"}
    billed_units: Dict[str, int] = {"search_units": 1}
    warnings: Optional[List[str]] = None
    truncated: Optional[Truncation] = None


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
    ranking_score: Optional[float] = Field(None, description="the uncalibrated ranking score the results are ordered "
                                                             "by (set when reranked)")
    first_stage_rank: Optional[int] = Field(None, description="1-based position among the first-stage candidates")


class FirstStageHit(BaseModel):
    image_id: str
    first_stage_score: float = Field(..., description="cosine similarity of the pooled embeddings")
    url: Optional[str] = None


class SearchResponse(BaseModel):
    model: str
    results: List[SearchResult]
    usage: Usage
    reranked: bool = Field(True, description="false for an image-only query: results in first-stage order, "
                                             "relevance_score = first_stage_score (no text to rerank against)")
    first_stage: Optional[List[FirstStageHit]] = Field(
        None, description="with return_first_stage: the top_k candidates in first-stage order, before reranking")
    expected_image_id: Optional[str] = Field(
        None, description="the image the query text is a caption of, when the server's caption sources hold that "
                          "exact caption for exactly one image (sample worlds, evaluation sets); absent otherwise")
    meta: Optional[ResponseMeta] = Field(None, description="present when the query was truncated")


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


class ShardInfo(BaseModel):
    shard: int
    images: int
    memory_bytes: int


class AddImageResponse(BaseModel):
    """An added image: its id, content hash and the corpus size after it."""

    id: str
    sha256: str
    url: Optional[str] = None
    corpus_size: int


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
    ranking: Optional[Dict[str, Any]] = Field(
        None, description="the checkpoint's ranking rule: fusion weight, Platt calibration (scale, bias, where "
                          "fitted), and the rule in words")
    live_images: Optional[Dict[str, Any]] = None
    shards: Optional[List[ShardInfo]] = Field(None, description="per shard (when the corpus is split): its images and "
                                                                "the token bytes its reranker replica holds")


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    """GET /readyz: whether every deployment of the application answers, and what each said."""

    status: Literal["ready", "not ready"]
    deployments: Dict[str, str]  # deployment name -> "ok", or why not
    detail: Optional[str] = None  # the deployments that did not answer, named
