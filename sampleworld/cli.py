"""Command line: ``python -m edje.sampleworld generate | urls | serve | build-table | build-sprites``."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Sequence

from .open_world import OPEN_DEFAULTS
from .records import DEFAULT_KIND, SPLITS, WorldConfig
from .registry import KINDS, world_config
from .world import generate, write_url_list

_DEFAULTS = WorldConfig()


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Deterministic compositional image-caption world.")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="write images, flickr30k_*.json annotations and world.json")
    g.add_argument("--seed", type=int, default=_DEFAULTS.seed, help="random seed; same seed gives the same bytes (default %(default)s)")
    g.add_argument("--out", required=True, help="output directory (created if missing)")
    g.add_argument("--world", choices=KINDS, default=DEFAULT_KIND,
                   help="shapes: 6 shapes x 8 colours x 2 sizes; open: emoji glyphs of hundreds of real nouns with size, "
                   "count and facing (default %(default)s)")
    g.add_argument("--n-train", type=int, default=_DEFAULTS.n_train, help="train images, rounded to whole families (default %(default)s)")
    g.add_argument("--n-val", type=int, default=_DEFAULTS.n_val, help="val images, rounded to whole families (default %(default)s)")
    g.add_argument("--n-test", type=int, default=_DEFAULTS.n_test, help="test images, rounded to whole families (default %(default)s)")
    g.add_argument("--image-size", type=int, default=_DEFAULTS.image_size, help="image side in pixels (default %(default)s)")
    g.add_argument("--family-size", type=int, default=_DEFAULTS.family_size, help="images per family: base + twins (default %(default)s)")
    g.add_argument("--captions-per-image", type=int, default=_DEFAULTS.captions_per_image, help="captions per image (default %(default)s)")
    g.add_argument("--min-objects", type=int, default=None,
                   help=f"fewest objects per scene (default {_DEFAULTS.min_objects}; open: {OPEN_DEFAULTS['min_objects']})")
    g.add_argument("--max-objects", type=int, default=None,
                   help=f"most objects per scene (default {_DEFAULTS.max_objects}; open: {OPEN_DEFAULTS['max_objects']}); "
                   "--min-objects 1 --max-objects 1 --family-size 1 is the curriculum's first world: one object per image, "
                   "no twins")
    g.add_argument("--same-side-rate", type=float, default=None,
                   help="share of two-object families with both objects on one side of the image centre "
                   f"(default {_DEFAULTS.same_side_rate}; open: {OPEN_DEFAULTS['same_side_rate']})")
    g.add_argument("--held-out", nargs="+", default=[], metavar="VALUE+VALUE",
                   help="attribute combinations withheld, e.g. red+circle large+square; shapes worlds also take one "
                   "relation side (left, right, above, below) per combination: star+left is a star that lies left of "
                   "another object as the captions state it (\"a star left of a circle\", \"a circle right of a star\"); "
                   "open worlds: a noun or category with a size, count or facing, e.g. dog+large animal+two car+left, "
                   "where left is the way a thing faces (see --held-out-mode)")
    g.add_argument("--held-out-mode", choices=("exclude", "only"), default="exclude",
                   help="exclude: no image shows a held-out combination (training worlds); only: every image shows "
                   "one (the held-out test world)")

    u = sub.add_parser("urls", help="write a CC12M-style url list (url, caption, image_id) for a generated world")
    u.add_argument("--world", required=True, help="directory written by 'generate'")
    u.add_argument("--base-url", required=True, help="URL at which the world directory is served, e.g. http://127.0.0.1:8000")
    u.add_argument("--out", required=True, help="output file (.tsv or .parquet)")
    u.add_argument("--splits", default=",".join(SPLITS), help="comma-separated splits to include (default %(default)s)")
    u.add_argument("--format", choices=("tsv", "parquet"), default="tsv", help="file format (default %(default)s)")

    sub.add_parser("build-table", help="rewrite the open world's glyph table (open_assets/glyphs.tsv) from the curated list")
    b = sub.add_parser("build-sprites", help="render the open world's sprite sheet (open_assets/sprites.png) from the font")
    b.add_argument("--font", default=None, help="Noto Color Emoji .ttf (default: where fonts-noto-color-emoji installs it)")

    s = sub.add_parser("serve", help="serve a directory over HTTP until interrupted")
    s.add_argument("--root", required=True, help="directory to serve (usually a generated world)")
    s.add_argument("--host", default="127.0.0.1", help="interface to bind (default %(default)s)")
    s.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default %(default)s)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _build_parser().parse_args(argv)
    if args.command == "generate":
        # Unset options take the kind's default; a shapes world's are WorldConfig's, so its bytes never change.
        kind_defaults = world_config(args.world)
        for k in ("min_objects", "max_objects", "same_side_rate"):
            if getattr(args, k) is None:
                setattr(args, k, getattr(kind_defaults, k))
        config = WorldConfig(
            seed=args.seed,
            n_train=args.n_train,
            n_val=args.n_val,
            n_test=args.n_test,
            image_size=args.image_size,
            family_size=args.family_size,
            captions_per_image=args.captions_per_image,
            min_objects=args.min_objects,
            max_objects=args.max_objects,
            held_out=tuple(args.held_out),
            held_out_mode=args.held_out_mode,
            same_side_rate=args.same_side_rate,
            kind=args.world,
        )
        t0 = time.perf_counter()
        m = generate(config, args.out)
        counts = ", ".join(f"{k}={len(v)}" for k, v in m.splits.items())
        print(f"wrote {len(m.images)} images ({counts}) to {m.root} in {time.perf_counter() - t0:.1f}s")
        return 0
    if args.command == "urls":
        splits = tuple(s.strip() for s in args.splits.split(",") if s.strip())
        out = write_url_list(args.world, args.base_url, args.out, splits=splits, fmt=args.format)
        print(out)
        return 0
    if args.command == "build-table":
        from .open_table import write_table

        print(write_table())
        return 0
    if args.command == "build-sprites":
        from .open_glyphs import load_glyphs
        from .open_sprites import FONT_PATH, build_sheet

        load_glyphs.cache_clear()
        print(build_sheet([g.codepoint for g in load_glyphs().glyphs], font_path=args.font or FONT_PATH))
        return 0
    if args.command == "serve":
        from .server import serve_directory

        srv = serve_directory(args.root, host=args.host, port=args.port)
        # SIGTERM (how test harnesses and process managers stop us) exits like Ctrl-C.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        print(srv.base_url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            srv.stop()
        return 0
    return 2  # unreachable: argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
