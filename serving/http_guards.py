"""The ingress's ASGI middlewares, installed as `edje.serving.http_guards`: the bearer token (`BearerAuth`) and the
admission gate (`AdmissionGate`), both run before a route reads or validates the body, so that no route (present or
added later) answers first. `PUBLIC_PATHS` are open to both; `SECURED` declares the token in the OpenAPI schema for the
routes that need it (serving/ingress.py `build_api` installs the middlewares, the routers declare the scheme).
"""
import hmac
from typing import Optional

from fastapi import Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer

from edje.serving.http_errors import retry_after_header

# Reachable without the token: liveness, readiness and the API's own description.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
# Declares the scheme in OpenAPI only (auto_error off): BearerAuth has already checked the token when a route runs.
BEARER = HTTPBearer(auto_error=False, description="required when the server is started with an auth token")
SECURED = [Security(BEARER)]


class BearerAuth:
    """ASGI middleware: every path but PUBLIC_PATHS needs `Authorization: Bearer <token>`, checked before
    the request body is read, so that no route (present or added later) validates or answers first."""

    def __init__(self, app, token: Optional[str], public: frozenset = PUBLIC_PATHS):
        self.app, self.token, self.public = app, token, public

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.token is None or _route_path(scope) in self.public:
            return await self.app(scope, receive, send)
        header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return await self.app(scope, receive, send)
        response = JSONResponse(status_code=401, content={"detail": "missing or wrong bearer token"},
                                headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


class AdmissionGate:
    """ASGI middleware: at most `limit` requests in flight in this replica (paths in `exempt` aside); each one beyond
    is answered 503 with Retry-After at once, never queued. A replica runs its app on one event loop, so a plain
    counter is exact."""

    def __init__(self, app, limit: int, retry_after_s: float, exempt: frozenset = PUBLIC_PATHS):
        self.app, self.limit, self.exempt, self.in_flight = app, limit, exempt, 0
        self.headers = retry_after_header(retry_after_s)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or _route_path(scope) in self.exempt:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.limit:
            response = JSONResponse(status_code=503, headers=self.headers,
                                    content={"detail": f"overloaded: {self.limit} requests in flight, retry"})
            return await response(scope, receive, send)
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def _route_path(scope) -> str:
    """The path below the app's route prefix (Serve mounts apps under one; the scope's path may include it)."""
    path, root = scope.get("path", ""), scope.get("root_path") or ""
    return (path[len(root):] or "/") if root and path.startswith(root) else path
