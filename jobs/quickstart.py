"""The whole EDJE loop on the embedded default, in one command, on one machine with no internet.

    .venv/bin/python jobs/quickstart.py                 # the shapes world
    .venv/bin/python jobs/quickstart.py --world open    # the open-vocabulary world (551 emoji nouns)

1. a local Ray cluster; 2. the sample world generated and served on loopback; 3. img2dataset
downloads it and the encode job writes raw backbone-token tables (training input); 4. the
project's shipped checkpoints (or, with --pretrain-steps, a short pretraining on those raw
tables); 5. the encode job writes compressed int8 token tables with the checkpoint's adapter;
6. evaluation before and after reranking; 7. Ray Serve with the reranker; one /v1/rerank
request; 8. a table of recall before and after and the top results of that request.
Everything it started is stopped at the end; with --keep-serving the server stays up on the quickstart's
corpus with the search page on (thumbnails from the sample world's image folder), until Ctrl-C.

--world picks the sample world and, with it, the defaults of the options that say "the chosen world's": the
reranker, its backbone's weights (the backbone itself is the one the checkpoint's config.json names) and its
training world. The report counts the test images whose meaning (Scene.signature) repeats a training scene of the
checkpoint's training world (shapes: --train-world-seed 100, the shipped checkpoints'; open: 300) and gives recall
and within-family accuracy again over the novel ones. On the open world it also gives the text→image figures over
the queries written from a held-out (test-only) caption template. --held-out-mode only|exclude tests a checkpoint
whose config.json names the combinations it never saw (`held_out`) on a world made only of them, or on one without
them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional, Union

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the quickstart needs only files the repository ships
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from edje.jobs.quickstart_worlds import DEFAULT_WORLD, WORLD_PRESETS, per_world, preset  # noqa: E402
from edje.model.ranking import RankingConfig  # noqa: E402
from edje.schemas.cli_options import add_options, from_args, option  # noqa: E402
from edje.schemas.shipped import LOCAL_RERANKER  # noqa: E402
from edje.serving.ports import free_port  # noqa: E402

NO_SPLIT = "none"  # --train-world-seed none: no novel-meaning split (None is "the chosen world's")


def seed_or_none(text: str) -> Union[int, str]:
    """A world seed, or NO_SPLIT for 'none'."""
    return NO_SPLIT if text.lower() == NO_SPLIT else int(text)


class MissingFile(FileNotFoundError):
    """A file the run needs is not there; raised before Ray starts, its message one line."""


@dataclass(frozen=True)
class QuickstartConfig:
    """Options of the quickstart run (each field's command-line option is written on it)."""

    output: str = option("runs/quickstart", help="output folder (default %(default)s)")
    world: str = option(DEFAULT_WORLD, choices=tuple(WORLD_PRESETS), help="sample world: shapes (coloured shapes) or "
                        "open (551 emoji nouns); the options below that default to 'the chosen world's' follow it "
                        "(default %(default)s)")
    seed: int = option(0, help="sample world seed (default %(default)s: on shapes, the benchmark's world)")
    # None (here and below): the chosen world's, from its preset (jobs/quickstart_worlds.py).
    checkpoint: Optional[str] = option(
        None, help=f"EDJE checkpoint (default: the chosen world's: {per_world('checkpoint')}; on shapes "
        f"{LOCAL_RERANKER} is the local one over all 64 backbone tokens)")
    backbone_weights: Optional[str] = option(
        None, help=f"weights of the backbone the checkpoint's config.json names (default: the chosen world's: "
        f"{per_world('backbone_weights')}; with another --checkpoint, the weights its config.json records)")
    quant: str = option("int8", choices=["fp16", "int8", "int4"], help="token storage (default %(default)s)")
    k: int = option(10, help="first-stage candidates reranked (default %(default)s)")
    queries_per_image: Optional[int] = option(1, help="text→image queries per test image (default %(default)s; 5 = "
                                              "all captions, slower)")
    pretrain_steps: int = option(0, help="run a short Ray Train pretraining from the checkpoint first "
                                 "(default: none)")
    num_cpus: int = option(2, help="CPUs of the local Ray (default %(default)s)")
    # whole families are kept
    test_images: Optional[int] = option(None, help="encode and evaluate only the first N test images (default: all)")
    keep_serving: bool = option(False, help="leave the server up with the search page on (its address is printed) "
                                "until Ctrl-C")
    port: int = option(0, help="Serve's HTTP port (default: a free one)")  # 0: a free one
    # Share of two-object families with both objects on one side of the image centre: relations there
    # cannot be read from the subject's side alone, and the report gives them as their own subset.
    same_side_rate: Optional[float] = option(
        None, help=f"share of two-object families with both objects on one side of the centre (default: the chosen "
        f"world's: {per_world('same_side_rate')})")
    # The world the checkpoint was trained on: test images whose meaning repeats one of its training scenes are
    # counted, and every figure is given again over the others. NO_SPLIT: no such split.
    train_world_seed: Union[int, str, None] = option(
        None, type=seed_or_none, help=f"world the checkpoint was trained on (default: the chosen world's, its "
        f"checkpoint's: {per_world('train_world_seed')}; 'none' skips the split): test images whose "
        "meaning repeats one of its training scenes are counted and every figure is given again over the novel ones; "
        "its scenes are sampled, nothing rendered")
    train_world_n_train: Optional[int] = option(
        None, help=f"train images of that world (default: the chosen world's: {per_world('train_world_n_train')})")
    train_world_n_val: Optional[int] = option(
        None, help=f"val images of that world (default: the chosen world's: {per_world('train_world_n_val')})")
    # "only" / "exclude": test on a world made only of the checkpoint's held-out combinations, or without them.
    held_out_mode: Optional[str] = option(
        None, choices=("only", "exclude"), help="test on a world made only of the combinations the checkpoint never "
        "saw (its config.json's held_out), or on one without them: a test split alone, as `sampleworld generate "
        "--world WORLD --n-train 0 --n-val 0 --held-out ... --held-out-mode MODE`")


@dataclass(frozen=True)
class Models:
    """The reranker checkpoint and the backbone it was trained with, as this run uses them."""

    checkpoint: str
    backbone: str  # the open_clip name the checkpoint's config.json records
    backbone_weights: str


def step(n: int, text: str, t0: float) -> None:
    """Print a numbered progress line with the elapsed time."""
    print(f"\n=== [{n}/8] {text}  (t={time.time() - t0:.0f}s)", flush=True)



def run(cfg: QuickstartConfig) -> dict:
    """Run the loop; returns the recall metrics and the rerank response."""
    # Everything that can fail on the files at hand fails here, before Ray is imported or started.
    cfg = world_defaults(cfg)
    models = resolve_models(cfg)
    held_out = checkpoint_held_out(models.checkpoint, required=cfg.held_out_mode is not None,
                                   kind=preset(cfg.world).kind)

    import ray
    import requests
    from ray import serve

    from edje.evaluation.rerank_eval import EvalConfig, evaluate
    from edje.pipeline.job import run_encode_job
    from edje.sampleworld.server import serve_directory
    from edje.schemas.encode_job import EncodeJobConfig
    from edje.serving.app import build
    from edje.serving.config import ServeConfig

    t0 = time.time()
    out = (ROOT / cfg.output).resolve() if not os.path.isabs(cfg.output) else Path(cfg.output)
    world_cfg = world_config(cfg, held_out)
    against = reference_world(cfg, held_out)
    out.mkdir(parents=True, exist_ok=True)

    step(1, "starting a local Ray cluster", t0)
    ray.init(address="local", num_cpus=cfg.num_cpus, include_dashboard=False, log_to_driver=False)
    server = None
    try:
        step(2, f"generating the {cfg.world} sample world (seed {cfg.seed}) and serving it on loopback", t0)
        if cfg.held_out_mode:
            print(f"    {held_out_line(held_out, cfg.held_out_mode, models.checkpoint)}", flush=True)
        world = prepare_world(out, world_cfg, cfg.test_images)
        server = serve_directory(world, port=previous_port(out / "test_urls.tsv"))
        urls = test_url_list(world, server.base_url, out / "test_urls.tsv", cfg.test_images)
        print(f"    {server.base_url} serves {world}; url list of the test split: {urls}", flush=True)

        step(3, f"img2dataset download + raw backbone-token encode with {models.backbone} (Ray Data)", t0)
        common = dict(input=str(urls), backbone=models.backbone, pretrained=models.backbone_weights, shard_size=250,
                      num_cpus=cfg.num_cpus)
        raw = run_encode_job(EncodeJobConfig(output=str(out / "raw"), **common))

        checkpoint = models.checkpoint
        if cfg.pretrain_steps:
            step(4, f"short pretraining on Ray Train ({cfg.pretrain_steps} steps, from {shown_path(models.checkpoint)})",
                 t0)
            checkpoint = str(out / "pretrained")
            subprocess.run([sys.executable, str(ROOT / "jobs" / "pretrain.py"), "--tables", *raw["tables"],
                            "--storage-path", str(out / "train"), "--name", "quickstart", "--init", models.checkpoint,
                            "--max-steps", str(cfg.pretrain_steps), "--num-workers", "1", "--batch-size", "16",
                            "--export", checkpoint, "--ray-address", ray.get_runtime_context().gcs_address],
                           check=True)
        else:
            step(4, f"using the checkpoint {shown_path(checkpoint)}", t0)
            made_by = json.loads((Path(checkpoint) / "config.json").read_text()).get("command")
            if made_by:
                print(f"    made by: {made_by}", flush=True)

        step(5, f"compressed-token encode with the checkpoint's adapter ({cfg.quant})", t0)
        comp = run_encode_job(EncodeJobConfig(output=str(compressed_folder(out, checkpoint, cfg.quant)), adapter=checkpoint,
                                              quant=cfg.quant, **common))

        step(6, f"evaluation: first stage (FAISS) vs EDJE reranking of the top {cfg.k}", t0)
        ann = annotations(world, cfg.test_images)
        metrics = evaluate(EvalConfig(annotations=str(ann), tokens=list(comp["tables"]),
                                      output=str(out / "eval"), checkpoint=checkpoint, k=cfg.k,
                                      backbone_pretrained=models.backbone_weights,
                                      max_queries_per_image=cfg.queries_per_image, novel_against=against,
                                      held_out_template_queries=preset(cfg.world).held_out_template_queries))

        step(7, "Ray Serve: token store + first stage + reranker behind FastAPI; one /v1/rerank request", t0)
        port = cfg.port or free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve_cfg = ServeConfig(checkpoint=checkpoint, token_tables=tuple(comp["tables"]),
                                backbone_pretrained=models.backbone_weights)
        if cfg.keep_serving:
            serve_cfg = serve_cfg.replace(**page_options(world, ann, out))
        serve.run(build(serve_cfg), name="edje", route_prefix="/")
        query, documents, answer = rerank_request(world, cfg.test_images)
        base = f"http://127.0.0.1:{port}"
        token = serve_cfg.resolved_auth_token()  # EDJE_API_TOKEN in the environment turns auth on
        response = requests.post(f"{base}/v1/rerank", json={"query": query, "documents": documents, "top_n": 5,
                                                            "return_documents": True}, timeout=120,
                                 headers={"Authorization": f"Bearer {token}"} if token else {}).json()

        step(8, "results", t0)
        if cfg.held_out_mode:
            print(f"\n{held_out_line(held_out, cfg.held_out_mode, models.checkpoint)}")
        print_report(metrics, query, documents, answer, response, raw, comp)
        (out / "rerank_response.json").write_text(json.dumps(response, indent=2))
        print(f"\nquickstart finished in {time.time() - t0:.0f}s; outputs under {out} "
              f"(eval/metrics.md, eval/examples.png, rerank_response.json)", flush=True)
        if cfg.keep_serving:
            server.stop()  # the page's thumbnails come from the world's image folder, not from this server
            server = None
            wait_for_interrupt(base, query)
        return {"metrics": metrics, "response": response}
    finally:
        try:
            serve.shutdown()
        except Exception:  # Serve was never started
            pass
        ray.shutdown()
        if server is not None:
            server.stop()


def checkpoint_held_out(checkpoint: str, required: bool = False, kind: str = DEFAULT_WORLD) -> tuple:
    """The combinations the checkpoint never saw in training (config.json's `held_out`, in the `--held-out` syntax of
    `sampleworld generate --world KIND`); ValueError when `required` and it names none, or names a value that world
    kind does not know."""
    from edje.sampleworld.registry import world_kind

    path = Path(checkpoint) / "config.json"
    held = json.loads(path.read_text()).get("held_out") if path.exists() else None
    if not held:
        if required:
            raise ValueError(f"--held-out-mode needs the combinations the checkpoint never saw, but {path} has no "
                             f"`held_out` key (e.g. \"held_out\": [\"red+circle\", \"large+square\"]); the shipped "
                             f"checkpoints saw every combination")
        return ()
    if isinstance(held, str) or not all(isinstance(h, str) for h in held):
        raise ValueError(f"{path}: `held_out` must be a list of VALUE+VALUE strings, got {held!r}")
    world_kind(kind).parse_held_out(held, "exclude")  # the generator's own check: fails here, not mid-run
    return tuple(held)


def world_defaults(cfg: QuickstartConfig) -> QuickstartConfig:
    """`cfg` with the options left to the chosen world taken from its preset (no file read; the backbone weights are
    resolve_models's, since with another checkpoint they are the ones it records)."""
    p = preset(cfg.world)
    return replace(cfg, checkpoint=cfg.checkpoint or str(ROOT / p.checkpoint),
                   same_side_rate=p.same_side_rate if cfg.same_side_rate is None else cfg.same_side_rate,
                   train_world_seed=p.train_world_seed if cfg.train_world_seed is None else cfg.train_world_seed,
                   train_world_n_train=p.train_world_n_train if cfg.train_world_n_train is None else cfg.train_world_n_train,
                   train_world_n_val=p.train_world_n_val if cfg.train_world_n_val is None else cfg.train_world_n_val)


def resolve_models(cfg: QuickstartConfig) -> Models:
    """The checkpoint, the backbone its config.json names and that backbone's weights: --backbone-weights, else the
    world's shipped file for the world's own checkpoint, else the file the checkpoint records. MissingFile (one line)
    when a file is not there."""
    from edje.schemas.weights import find_weights

    cfg = world_defaults(cfg)
    p = preset(cfg.world)
    default_ck = Path(cfg.checkpoint).resolve() == (ROOT / p.checkpoint).resolve()
    default_weights = ROOT / p.backbone_weights
    config = Path(cfg.checkpoint) / "config.json"
    missing = []
    if not config.is_file():
        missing.append(f"reranker {shown_path(cfg.checkpoint)} (no config.json there)")
    if default_ck and not cfg.backbone_weights and not default_weights.is_file():
        missing.append(f"backbone weights file {shown_path(str(default_weights))}")
    if missing:
        whose = f"the {cfg.world} world's default " if default_ck else ""
        raise MissingFile(f"{whose}{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing; "
                          f"--checkpoint and --backbone-weights choose others")
    backbone = json.loads(config.read_text()).get("config", {}).get("backbone", {})
    if not backbone.get("name"):
        raise MissingFile(f"{shown_path(str(config))} names no backbone (config.backbone.name); is it an EDJE "
                          f"checkpoint? --checkpoint chooses another")
    if cfg.backbone_weights:
        weights = cfg.backbone_weights
    elif default_ck:
        weights = str(default_weights)
    else:
        recorded = backbone.get("pretrained")
        weights = find_weights(recorded, checkpoint=cfg.checkpoint) if recorded else None
        if weights is None or not Path(weights).is_file():
            raise MissingFile(f"the backbone weights {recorded!r} that {shown_path(str(config))} records are not on "
                              f"this machine; --backbone-weights names them")
    return Models(checkpoint=cfg.checkpoint, backbone=backbone["name"], backbone_weights=weights)


def world_config(cfg: QuickstartConfig, held_out: tuple):
    """The sample world to test on: the chosen kind's default world for the seed (`sampleworld generate --world KIND`'s
    defaults), or (--held-out-mode) a test split only made of, or without, the held-out combinations, as
    BENCHMARKS.md's t9898 / t9797 (its first N images whatever N is)."""
    from edje.sampleworld.registry import world_config as kind_world

    cfg = world_defaults(cfg)
    kind = preset(cfg.world).kind
    # None: the kind's own default, so it is not passed
    side = {} if cfg.same_side_rate is None else {"same_side_rate": cfg.same_side_rate}
    if not cfg.held_out_mode:
        return kind_world(kind, seed=cfg.seed, **side)
    base = kind_world(kind)
    n_test = -(-(cfg.test_images or base.n_test) // base.family_size) * base.family_size  # whole families
    return kind_world(kind, seed=cfg.seed, n_train=0, n_val=0, n_test=n_test, held_out=held_out,
                      held_out_mode=cfg.held_out_mode, **side)


def reference_world(cfg: QuickstartConfig, held_out: tuple):
    """The checkpoint's training world, whose train scenes count as seen, drawn as the chosen world's kind; it
    withheld the checkpoint's held-out combinations (an exclude world, as ex100 for the held-out twins). None with
    --train-world-seed none."""
    from edje.evaluation.novelty import parse_reference

    cfg = world_defaults(cfg)
    if cfg.train_world_seed == NO_SPLIT:
        return None
    return parse_reference(str(cfg.train_world_seed), cfg.train_world_n_train, cfg.train_world_n_val, held_out,
                           preset(cfg.world).kind)


def compressed_folder(out: Path, checkpoint: str, quant: str) -> Path:
    """The compressed tables' folder: one per adapter (its weights' hash) and precision, so that a run with another
    checkpoint (a new default, --checkpoint) encodes its own tables beside, not into, another adapter's."""
    adapter = json.loads((Path(checkpoint) / "config.json").read_text()).get("adapter_hash", "unhashed")
    return out / f"compressed-{quant}-{adapter}"


def prepare_world(out: Path, config, test_images: Optional[int]) -> Path:
    """`out/world` generated for `config`, or reused when it already is; a world made otherwise is regenerated and
    the token tables encoded from it are removed (their image ids would name other images). Of its images, only the
    test split's first `test_images` are drawn: the rest of the world is never read here."""
    import shutil

    from edje.sampleworld import draw_images, generate, load_world, load_world_config

    world = out / "world"
    reuse = False
    if (world / "world.json").exists():
        try:
            reuse = load_world_config(world) == config
        except (ValueError, KeyError, TypeError):  # an older or foreign world.json: made otherwise
            pass
        if not reuse:
            print(f"    {world} holds another world: regenerating it and re-encoding its tables", flush=True)
            for stale in [out / "raw", *out.glob("compressed-*")]:
                shutil.rmtree(stale, ignore_errors=True)
    manifest = load_world(world) if reuse else generate(config, world, images=False)
    draw_images(manifest, manifest.splits["test"][:test_images])
    return world


def previous_port(urls: Path) -> int:
    """The port an earlier run into this folder served the world on (0: none). The encode jobs' plans name the urls,
    so a rerun that serves the same world on the same port resumes them instead of refusing a different job."""
    from urllib.parse import urlsplit

    try:
        return urlsplit(urls.read_text().splitlines()[1].split("\t")[0]).port or 0
    except (OSError, IndexError, ValueError):
        return 0


def shown_path(path: str) -> Path:
    """A path as printed: relative to the repository when inside it, absolute otherwise."""
    full = Path(path).resolve()
    return full.relative_to(ROOT) if full.is_relative_to(ROOT) else full


def held_out_line(held_out: tuple, mode: str, checkpoint: str) -> str:
    """Which combinations the test world was made of (only) or without (exclude), and whose they are."""
    what = "made only of images that show one of" if mode == "only" else "without"
    return (f"held-out combinations ({shown_path(checkpoint)}/config.json): {', '.join(held_out)}; "
            f"the test world is {what} them (--held-out-mode {mode})")


def page_options(world: Path, annotations_path: Path, out: Path) -> dict:
    """ServeConfig fields of the kept server: the search page, thumbnails from the world's image folder, live
    images, and the test captions (so that the page can mark the image a caption belongs to)."""
    import shutil

    live = out / "live"
    # A fresh live folder each run: tables encoded with another run's checkpoint could not be loaded.
    shutil.rmtree(live, ignore_errors=True)
    return dict(ui=True, image_dir=str(world / "images"), live_dir=str(live), caption_sources=(str(annotations_path),))


def wait_for_interrupt(base: str, query: str) -> None:
    """Print the search page's address and block until Ctrl-C or SIGTERM (the caller then stops everything)."""
    import signal
    from urllib.parse import quote

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # Ray's own SIGTERM handler ends the process on the spot, leaving its agents behind; and a shell that starts
    # this in the background ignores SIGINT. Both become a KeyboardInterrupt here, so that everything is stopped.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    print(f"\nsearch page: {base}/ui/\n  a test caption, its image marked: {base}/ui/?q={quote(query)}", flush=True)
    if os.environ.get("EDJE_API_TOKEN"):
        print("  the page asks for the bearer token (EDJE_API_TOKEN)", flush=True)
    print("serving until Ctrl-C", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopping the server, Ray and everything else the quickstart started", flush=True)


def test_url_list(world: Path, base_url: str, path: Path, limit: Optional[int]) -> Path:
    """CC12M-style url list of the test split (or its first `limit` images)."""
    from edje.sampleworld import url_rows

    rows = url_rows(world, base_url, splits=("test",))[:limit]
    cols = ("url", "caption", "image_id")  # captions hold no tabs or newlines (the world guarantees it)
    path.write_text("\n".join(["\t".join(cols)] + ["\t".join(r[c] for c in cols) for r in rows]) + "\n")
    return path


def annotations(world: Path, limit: Optional[int]) -> Path:
    """The test split's annotation file, cut to the images that were encoded."""
    full = world / "flickr30k_test.json"
    if limit is None:
        return full
    cut = world / f"flickr30k_test_first{limit}.json"  # beside images/: paths in it are relative
    cut.write_text(json.dumps(json.loads(full.read_text())[:limit]))
    return cut


def rerank_request(world: Path, limit: Optional[int]):
    """A test caption, its image's family (the attribute-swapped twins) plus other images, and the answer."""
    from edje.sampleworld import load_world

    manifest = load_world(world)
    test = [r for r in manifest.images if r.split == "test"][:limit]
    target = test[len(test) // 3]
    family = [r.image_id for r in test if r.family_id == target.family_id]
    others = [r.image_id for r in test if r.family_id != target.family_id][:max(0, 10 - len(family))]
    documents = sorted(family + others)
    return target.captions[0], documents, target.image_id


def recall_report(metrics: dict) -> str:
    """Recall and within-family accuracy of each stage, both directions, by twin kind, and again over the novel
    answers, as the Markdown tables of eval/metrics.md."""
    from edje.evaluation.rerank_eval import held_out_markdown, novel_markdown, recall_markdown, twin_markdown

    # Within-family: the right image (caption) ranked above its binding twins, among queries whose top k holds both:
    # what reranking is for. Of the relation subsets, the side one: where the subject's side alone cannot decide.
    lines = ["Recall on the sample world's test split (first stage = backbone embeddings via FAISS; within-family: "
             "the right image ranked above its binding twins, chance among a family of 4 is 25 %):", "",
             *recall_markdown(metrics, family=True), *twin_markdown(metrics, subsets="side")]
    if "novel" in metrics:
        lines += novel_markdown(metrics["novel"], subsets="side")
    if "held_out_templates" in metrics:
        lines += held_out_markdown(metrics["held_out_templates"], subsets="side")
    return "\n".join(lines)


def print_report(metrics, query, documents, answer, response, raw, comp) -> None:
    """Recall before/after and the top results of the rerank request."""
    print("\n" + recall_report(metrics))
    rule = RankingConfig(**metrics.get("ranking", {}))
    if rule.fuses:
        print(f"\n(reranked = {rule.formula()}, the checkpoint's rule, chosen on {rule.chosen_on}; the server ranks "
              "the same way)")
    print(f"\nstorage: raw {raw['bytes_per_image']:,} B/image, compressed {comp['bytes_per_image']:,} B/image")
    print(f"\nPOST /v1/rerank  query: {query!r}  ({len(documents)} documents: the answer's family of twins + others)")
    for rank, r in enumerate(response["results"], 1):
        doc = documents[r["index"]]
        mark = "  <- the right image" if doc == answer else ""
        print(f"  {rank}. {doc}  relevance {r['relevance_score']:.3f}{mark}")


def main(argv: Optional[List[str]] = None) -> int:
    """Parse options and run the quickstart."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p, QuickstartConfig)
    cfg = from_args(QuickstartConfig, p.parse_args(argv))
    checkpoint = world_defaults(cfg).checkpoint
    try:
        if (Path(checkpoint) / "config.json").is_file():  # a missing checkpoint is run's to report, by name
            checkpoint_held_out(checkpoint, required=cfg.held_out_mode is not None, kind=preset(cfg.world).kind)
    except ValueError as e:
        p.error(str(e))
    try:
        run(cfg)
    except MissingFile as e:
        raise SystemExit(f"quickstart: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
