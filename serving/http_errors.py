"""Errors as HTTP answers, installed as `edje.serving.http_errors`: the error bodies the OpenAPI schema documents
(`ERRORS`, `NOT_FOUND`, ...), the 422 of an invalid request with one readable message (`validation_error`), and
the status of a failed downstream deployment call, decided by the exception's type (`downstream_error`): 503 with
Retry-After when the deployment's state is to blame (replica lost, none available, overloaded, timed out), so a
client may retry; 500 for anything else.
"""
import logging
import math

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from edje.serving.shards import replica_lost

log = logging.getLogger("ray.serve")


class ErrorBody(BaseModel):
    detail: str


ERRORS = {401: {"model": ErrorBody, "description": "missing or wrong bearer token (when the server has one)"},
          503: {"model": ErrorBody, "description": "overloaded, or a downstream replica is being replaced: retry after "
                                                   "the Retry-After header's seconds"}}
TOO_LONG = {413: {"model": ErrorBody, "description": "with truncate: false, a text longer than the joint encoder reads "
                                                     "(max_text_tokens wordpieces), named with the limit"}}
NOT_FOUND = {404: {"model": ErrorBody, "description": "unknown image ids, named in the message"}}
IMAGE_ERRORS = {413: {"model": ErrorBody, "description": "an image larger than max_image_bytes or max_image_pixels"},
                422: {"description": "invalid request, or an image that cannot be fetched or decoded (named)"}}
DUPLICATE = {409: {"model": ErrorBody, "description": "the image id is already in the corpus"}}


def _message(e: dict) -> str:
    """One readable line for one pydantic error."""
    if e.get("type") == "json_invalid":
        ctx = e.get("ctx") or {}
        return f"malformed JSON body at position {e['loc'][-1]}: {ctx.get('error', e.get('msg'))}"
    where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
    if e.get("type") == "extra_forbidden":
        return (f"unknown field '{where}': not part of this API (the fields each route takes, and those it accepts "
                "and ignores, are in /openapi.json)")
    blank = e.get("type") == "string_pattern_mismatch" and (e.get("ctx") or {}).get("pattern") == r"\S"
    msg = "must not be empty or blank" if blank else e.get("msg")
    return f"{where}: {msg}" if where else str(msg)


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with FastAPI's error list plus one readable message."""
    errors = exc.errors()
    return JSONResponse(status_code=422, content={"detail": _jsonable(errors), "message": "; ".join(map(_message, errors))})


def _jsonable(errors: list) -> list:
    # pydantic puts exception objects into ctx; JSON cannot carry them.
    return [{k: (str(v) if k == "ctx" else v) for k, v in e.items() if k != "input" or isinstance(v, (str, int, float))}
            for e in errors]


def deployment_unavailable(error: BaseException) -> bool:
    """Whether a deployment call failed because of the deployment's state rather than the request, so that the
    same request may succeed later: its replica was lost (shards.replica_lost, the errors call_with_retry retries
    once), no replica could take it, the deployment is overloaded, or the call timed out."""
    # Imported here, as in shards.py: importing this module loads no Ray Serve.
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    # TimeoutError covers Ray's GetTimeoutError and asyncio's timeouts. A downstream replica's own exception arrives
    # as a RayTaskError that subclasses it, or else carries it as `cause`.
    busy = (BackPressureError, DeploymentUnavailableError, TimeoutError)
    return replica_lost(error) or isinstance(error, busy) or isinstance(getattr(error, "cause", None), busy)


def retry_after_header(retry_after_s: float) -> dict:
    """The Retry-After header of a 503: whole seconds, rounded up (the header takes no fraction)."""
    return {"Retry-After": str(math.ceil(retry_after_s))}


def downstream_error(method, error: Exception, retry_after_s: float) -> HTTPException:
    """503 with Retry-After (retry_after_s, rounded up) when the deployment is unavailable; 500 for anything else."""
    kind = type(error).__name__
    log.warning("downstream call %s failed: %s: %s", getattr(method, "_method_name", method), kind, error)
    if deployment_unavailable(error):
        return HTTPException(503, f"temporarily unavailable, retry: {kind}", headers=retry_after_header(retry_after_s))
    return HTTPException(500, f"internal error: {kind}")
