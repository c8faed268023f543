"""The search page (GET /ui, with `ServeConfig.ui`): static HTML, JavaScript and CSS from serving/ui/, no build step.

The files hold no data, so they are public (`page_paths`, added to the ingress's public paths); everything
the page shows comes from the API with the bearer token the page asks for, thumbnails included. A strict
Content-Security-Policy keeps the page to its own origin: no CDN, no inline script, images only from the
API's blobs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, FrozenSet, Tuple

from fastapi import FastAPI, HTTPException, Response
from fastapi.responses import RedirectResponse

UI_DIR = Path(__file__).resolve().parent / "ui"
INDEX = "index.html"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # small files: revalidate, so a new version shows at the next load
}


def page_files() -> Dict[str, Path]:
    """The page's files by name (only these are served: no path reaches anything else)."""
    return {p.name: p for p in sorted(UI_DIR.iterdir()) if p.is_file() and p.suffix in TYPES}


def page_paths() -> FrozenSet[str]:
    """The paths of the page, public like /healthz: they hold no data."""
    return frozenset({"/ui", "/ui/"} | {f"/ui/{name}" for name in page_files()})


def add_search_page(app: FastAPI) -> None:
    """GET /ui (redirect to /ui/), /ui/ (the page) and /ui/<file> on `app`, outside the OpenAPI schema."""
    files: Dict[str, Tuple[bytes, str]] = {n: (p.read_bytes(), TYPES[p.suffix]) for n, p in page_files().items()}

    def serve(name: str) -> Response:
        if name not in files:
            raise HTTPException(404, f"no file {name!r} in the search page")
        body, media_type = files[name]
        return Response(body, media_type=media_type, headers=HEADERS)

    @app.get("/ui", include_in_schema=False)
    async def page_redirect():
        # Relative, so that it lands right under any route prefix: /prefix/ui -> /prefix/ui/.
        return RedirectResponse("ui/", status_code=307)

    @app.get("/ui/", include_in_schema=False)
    async def page():
        return serve(INDEX)

    @app.get("/ui/{name}", include_in_schema=False)
    async def page_file(name: str):
        return serve(name)
