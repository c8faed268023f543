"""One annotation file per held-out caption template of an open world's test split, to read each template alone.

Each file holds every image of the split, each with one caption: its caption of that template, or else one of its
training-template captions. Evaluated with `jobs/evaluate.py --max-queries-per-image 1 --held-out-template-queries 0`,
the report's "held-out templates alone" section then reads that one template (the gallery is unchanged). The files go
beside the annotations, where evaluation finds world.json and the images.

  python -m edje.research.held_out_template_annotations runs/open/tmpl/qs301_c5q/world/flickr30k_test_first1000.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List


def template_annotations(entries: List[dict], records: Dict[str, dict]) -> Dict[str, List[dict]]:
    """Per held-out template id ("<things>/<template>"), the annotation entries that query it (see the module)."""
    held = sorted({t for e in entries for t, h in zip(records[e["image_id"]]["caption_templates"],
                                                       records[e["image_id"]]["held_out_captions"]) if h})
    out = {}
    for template in held:
        files = []
        for e in entries:
            r = records[e["image_id"]]
            by_template = dict(zip(r["caption_templates"], r["captions"]))
            plain = next(c for c, h in zip(r["captions"], r["held_out_captions"]) if not h)
            files.append({**e, "caption": [by_template.get(template, plain)]})
        out[template] = files
    return out


def main(argv=None) -> None:
    """Write ann_<things>_<template>.json beside the annotations and print each template's query count."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("annotations", help="an open world's test annotation file, world.json beside it")
    args = p.parse_args(argv)
    ann = Path(args.annotations)
    entries = json.loads(ann.read_text())
    records = {r["image_id"]: r for r in json.loads((ann.parent / "world.json").read_text())["images"]}
    for template, files in template_annotations(entries, records).items():
        path = ann.parent / f"ann_{template.replace('/', '_')}.json"
        path.write_text(json.dumps(files))
        queries = sum(template in records[e["image_id"]]["caption_templates"] for e in entries)
        print(f"{template}: {queries} queries -> {path}")


if __name__ == "__main__":
    main()
