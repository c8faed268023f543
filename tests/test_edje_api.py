"""The Python API (`from edje import EDJEReranker`): the README's snippet as written, agreement with jobs/evaluate.py,
the encode job's bytes, and a save/load round trip. The shipped checkpoint, no Ray."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edje import EDJEReranker, UnknownDocument
from edje.jobs.quickstart_worlds import WORLD_PRESETS
from edje.schemas.shipped import DEFAULT_RERANKER

REPO = Path(__file__).resolve().parent.parent
CHECKPOINT = REPO / DEFAULT_RERANKER


def _block(marker: str) -> str:
    """The first fenced block after a README marker comment."""
    text = (REPO / "README.md").read_text()
    m = re.search(re.escape(marker) + r"\s*```\w*\n(.*?)```", text, re.S)
    assert m, f"README lacks the block after {marker}"
    return m.group(1)


@pytest.fixture(scope="module")
def reranker():
    return EDJEReranker.from_pretrained(CHECKPOINT)


def test_readme_python_api_snippet_runs_as_written():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    for cmd in _block("<!-- api:world -->").strip().splitlines():
        subprocess.run(cmd.replace(".venv/bin/python", sys.executable), shell=True, check=True, cwd=REPO, env=env)
    # The snippet as written, then whether it needed Ray.
    code = _block("<!-- api:snippet -->") + "\nimport sys\nprint('ray loaded:', 'ray' in sys.modules)\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 6, proc.stdout
    roles = {x["role"] for x in json.loads((REPO / "runs" / "api-demo" / "world.json").read_text())["images"]}
    assert int(lines[0].split()[0]) in range(8) and lines[0].split()[-1] in roles
    assert lines[-1] == "ray loaded: False"


def test_rank_orders_by_the_rule_and_predict_agrees(reranker, tmp_path):
    from edje.sampleworld.world import WorldConfig, generate

    generate(WorldConfig(seed=4343, n_train=0, n_val=0, n_test=8), tmp_path / "w")
    world = json.loads((tmp_path / "w" / "world.json").read_text())["images"]
    paths = [str(tmp_path / "w" / x["image"]) for x in world]
    query = world[2]["captions"][0]
    hits = reranker.rank(query, paths, return_documents=True)
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True) and sorted(h["corpus_id"] for h in hits) == list(range(8))
    assert all(h["text"] == paths[h["corpus_id"]] for h in hits)  # CrossEncoder.rank's key
    assert reranker.rank(query, paths, top_k=2) == [{k: v for k, v in h.items() if k != "text"} for h in hits[:2]]
    # documents as bytes and PIL images score exactly like their files
    from PIL import Image
    as_bytes = reranker.rank(query, [Path(p).read_bytes() for p in paths])
    assert [h["score"] for h in as_bytes] == scores
    png = tmp_path / "same.png"  # lossless, so the PIL image and the file hold the same pixels
    with Image.open(paths[0]) as im:
        im.save(png)
        pil = im.copy()
    np.testing.assert_allclose(reranker.predict([(query, pil)]), reranker.predict([(query, str(png))]), atol=1e-5)
    # calibrated relevance = the rule's probability of the fused score
    rel = reranker.predict([(query, p) for p in paths], calibrated=True)
    by_id = {h["corpus_id"]: h["relevance"] for h in hits}
    np.testing.assert_allclose(rel, [by_id[i] for i in range(8)], atol=1e-9)
    # caller-given first-stage scores replace the towers' cosines when the rule fuses (the shipped default's
    # rule is ITM alone, chosen on validation; the earlier local checkpoint fuses)
    fusing = reranker if reranker.ranking.first_stage_weight > 0 else EDJEReranker.from_pretrained(
        str(REPO / "checkpoints" / "edje-local-bind"))
    assert fusing.ranking.first_stage_weight > 0
    given = fusing.rank(query, paths[:2], first_stage_scores=[1.0, 0.0])
    logits = fusing.predict([(query, p) for p in paths[:2]])
    w = fusing.ranking.first_stage_weight
    np.testing.assert_allclose(sorted(h["score"] for h in given), sorted([logits[0] + w, logits[1]]), atol=1e-4)
    # A switched rule reads each query's best candidate: pairs of two texts in one predict call are two queries.
    import shutil

    from edje.model.ranking import write_ranking
    switched_path = tmp_path / "switched"
    shutil.copytree(fusing.path, switched_path)
    rule = dataclasses.replace(fusing.ranking, low_confidence_weight=0.0, confidence_threshold=0.5)
    write_ranking(str(switched_path), rule)
    switched = EDJEReranker.from_pretrained(str(switched_path))
    other = world[5]["captions"][0]
    pairs = [(query, paths[0]), (other, paths[0]), (query, paths[1]), (other, paths[1])]
    cos = [0.9, 0.3, 0.1, 0.2]  # the query is sure of its best candidate (0.9), the other text is not (0.3)
    itm = switched.predict(pairs)
    np.testing.assert_allclose(switched.predict(pairs, calibrated=True, first_stage_scores=cos),
                               rule.probability(itm + np.array([w * 0.9, 0.0, w * 0.1, 0.0])), atol=1e-6)


def test_bad_documents_get_clear_errors(reranker, tmp_path):
    with pytest.raises(UnknownDocument, match="not an image file"):
        reranker.rank("a red circle", ["no-such-id-or-file"])
    with pytest.raises(ValueError, match="non-empty"):
        reranker.rank("  ", [b"x"])
    from edje.model.image_decode import ImageRejected
    with pytest.raises(ImageRejected):
        reranker.rank("a red circle", [b"not an image"])
    assert reranker.rank("a red circle", []) == []


@pytest.mark.slow
@pytest.mark.parametrize("kind,n_test", [("shapes", 240), ("open", 120)])
def test_rank_agrees_with_evaluate_within_family(kind, n_test, tmp_path):
    """jobs/evaluate.py's within-family accuracy is reproduced through the API alone on the same unseen world (int8
    storage on both sides): the first stage from the API's backbone towers, its top k ranked by `rank`, the same
    count over the result; on each world kind with its shipped compressed reranker. The queries counted and the wins
    may differ by one (an image encoded from its file here, from the table's stored embedding there)."""
    from edje.evaluation.recall import within_group_accuracy
    from edje.evaluation.rerank_eval import EvalConfig, evaluate
    from edje.evaluation.tables import encode_annotations
    from edje.model.backbone import VisionBackbone
    from edje.sampleworld.world import WorldConfig, generate
    from edje.schemas.annotations import load_annotations
    from edje.schemas.config import BackboneConfig

    checkpoint = REPO / WORLD_PRESETS[kind].checkpoint
    reranker = EDJEReranker.from_pretrained(checkpoint)
    root = tmp_path / "w"
    generate(WorldConfig(seed=9191, n_train=0, n_val=0, n_test=n_test, kind=kind), root)
    ann_path = root / "flickr30k_test.json"
    b = reranker.backbone_config
    encode_annotations(str(ann_path), VisionBackbone.create(BackboneConfig(b.name, b.pretrained, b.feature_layer)),
                       str(tmp_path / "raw.parquet"))
    torch.set_num_threads(2)
    k = 10
    metrics = evaluate(EvalConfig(annotations=str(ann_path), tokens=[str(tmp_path / "raw.parquet")],
                                  output=str(tmp_path / "e"), checkpoint=str(checkpoint), k=k, max_queries_per_image=1,
                                  quant="int8", examples=1))
    evaluated = metrics["t2i"]["within_family"]["reranked"]
    # the same queries through the API: each image's first caption, against every image of the world
    ann = load_annotations(str(ann_path))
    per_image = ann.image_to_captions()
    queries = [ann.captions[caps[0]] for caps in per_image]
    paths = [str(p) for p in ann.image_paths]
    images = reranker.encode_images(paths)
    text = reranker.encoder.encode_text(queries)
    top = np.argsort(-(text @ images.embeddings.T), axis=1, kind="stable")[:, :k]
    orders = np.stack([top[q][[h["corpus_id"] for h in reranker.rank(queries[q], [paths[i] for i in top[q]])]]
                       for q in range(len(queries))])
    world = {x["image_id"]: x["family_id"] for x in json.loads((root / "world.json").read_text())["images"]}
    group = np.array([world[i] for i in ann.image_ids])
    api = within_group_accuracy(orders, [np.array([i]) for i in range(len(queries))], group, k)
    print(f"within-family: API {api}, evaluate {evaluated}")
    assert abs(api["queries"] - evaluated["queries"]) <= 1
    wins = {"api": api["accuracy"] * api["queries"] / 100, "evaluate": evaluated["accuracy"] * evaluated["queries"] / 100}
    assert abs(wins["api"] - wins["evaluate"]) <= 1.01, wins


def test_encode_images_gives_the_encode_jobs_bytes(reranker, tmp_path):
    """The encode job's actor (pipeline/encode.py EncodeBatch) and encode_images store the same bytes for an image."""
    import ray

    from edje.model.image_decode import decode_image
    from edje.pipeline.encode import OK, EncodeBatch, EncoderSpec
    from edje.sampleworld.world import WorldConfig, generate

    generate(WorldConfig(seed=4444, n_train=0, n_val=0, n_test=8), tmp_path / "w")
    files = sorted((tmp_path / "w" / "images").glob("*.jpg"))
    b = reranker.backbone_config
    actor = EncodeBatch(EncoderSpec(b, str(CHECKPOINT), "int8", None))
    pp = actor.encoder.backbone.preprocess
    pixels = np.stack([decode_image(f.read_bytes(), pp.size, pp.resize_mode, 10**8) for f in files])
    n = len(files)
    out = actor({"image": pixels, "status": np.array([OK] * n, object), "shard": np.zeros(n, np.int32),
                 "row": np.arange(n, dtype=np.int32), "image_id": np.array([f.stem for f in files], object),
                 "url": np.array([str(f) for f in files], object), "caption": np.array(["c"] * n, object),
                 "detail": np.array([""] * n, object)})
    rows = reranker.encode_images([str(f) for f in files])
    assert [bytes(x) for x in rows.blob] == out.column("tokens").to_pylist()
    assert [x.tobytes() for x in rows.scales] == out.column("token_scales").to_pylist()
    assert not ray.is_initialized()  # the actor class outside Ray starts no Ray instance of its own


def test_save_pretrained_round_trips_bit_for_bit(reranker, tmp_path):
    saved = Path(reranker.save_pretrained(tmp_path / "copy"))
    assert (saved / "backbone").is_dir()
    again = EDJEReranker.from_pretrained(saved)
    mine, theirs = reranker.scorer.model.state_dict(), again.scorer.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert again.ranking == reranker.ranking
    assert Path(again.backbone_config.pretrained).read_bytes() == Path(reranker.backbone_config.pretrained).read_bytes()
    img = next((REPO / "tests").glob("**/*.jpg"), None) or _one_image(tmp_path)
    np.testing.assert_array_equal(again.encode_images([img]).blob, reranker.encode_images([img]).blob)
    with pytest.raises(ValueError, match="overwrite"):
        again.save_pretrained(saved)


def _one_image(tmp_path) -> str:
    from edje.sampleworld.world import WorldConfig, generate

    generate(WorldConfig(seed=1, n_train=0, n_val=0, n_test=4), tmp_path / "one")
    return str(next((tmp_path / "one" / "images").glob("*.jpg")))


def _world(tmp_path, seed=4545, n=8):
    from edje.sampleworld.world import WorldConfig, generate

    generate(WorldConfig(seed=seed, n_train=0, n_val=0, n_test=n), tmp_path / "w")
    world = json.loads((tmp_path / "w" / "world.json").read_text())["images"]
    return world, [str(tmp_path / "w" / x["image"]) for x in world]


def test_crossencoder_flags_batch_size_progress_bar_and_max_length(reranker, tmp_path, capsys):
    world, paths = _world(tmp_path)
    query = world[3]["captions"][0]
    one = reranker.rank(query, paths, batch_size=1, show_progress_bar=True)
    assert "pairs" in capsys.readouterr().err  # tqdm's bar, on stderr
    whole = reranker.rank(query, paths, batch_size=64)
    assert [h["corpus_id"] for h in one] == [h["corpus_id"] for h in whole]
    np.testing.assert_allclose([h["score"] for h in one], [h["score"] for h in whole], atol=1e-4)
    # A query cut to its first wordpieces scores as that prefix does (the image positions do not move).
    words = query.split()
    prefix = " ".join(words[:2])
    n = len(reranker.scorer.model.encoder.tokenizer.tokenize(prefix))
    full = reranker.predict([(prefix, paths[0])])
    reranker.max_length = n
    try:
        assert reranker.max_length == n
        np.testing.assert_allclose(reranker.predict([(query, paths[0])]), full, atol=1e-5)
    finally:
        reranker.max_length = reranker.scorer.model.encoder.config.max_text_tokens
    assert reranker.scorer.model.encoder.text_limit is None
    with pytest.raises(ValueError, match="max_length must be in 1..64"):
        reranker.max_length = 65


def test_from_pretrained_takes_a_hub_id_from_the_cache_offline(reranker, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from edje.storage.hub import CheckpointNotFound

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cache = tmp_path / "hub"
    with pytest.raises(CheckpointNotFound, match="HF_HUB_OFFLINE is set.*holds no copy"):
        EDJEReranker.from_pretrained("edje-ray/edje-c16-rel", cache_folder=str(cache))
    # The hub cache's own layout (what snapshot_download leaves behind): refs/main names the snapshot folder.
    repo = cache / "models--edje-ray--edje-c16-rel"
    revision = "0" * 40
    reranker.save_pretrained(repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    loaded = EDJEReranker.from_pretrained("edje-ray/edje-c16-rel", cache_folder=str(cache))
    assert Path(loaded.path) == repo / "snapshots" / revision
    world, paths = _world(tmp_path, seed=4646, n=4)
    pairs = [(world[0]["captions"][0], p) for p in paths]
    np.testing.assert_allclose(loaded.predict(pairs), reranker.predict(pairs), atol=1e-5)
    with pytest.raises(CheckpointNotFound, match="not a checkpoint folder"):
        EDJEReranker.from_pretrained(str(tmp_path / "no" / "such" / "folder"))


def test_open_vocabulary_captions_score_without_error(reranker, tmp_path):
    # Captions outside the sample world's vocabulary (an open world's real nouns, a verb use of "left"): the
    # scoring path runs the tokenizer and the model, and a checkpoint's diagnostic role parse finds no noun phrase.
    from edje.sampleworld.world import WorldConfig, generate

    generate(WorldConfig(seed=5, n_train=0, n_val=0, n_test=4, kind="open"), tmp_path / "open")
    world = json.loads((tmp_path / "open" / "world.json").read_text())["images"]
    paths = [str(tmp_path / "open" / x["image"]) for x in world]
    queries = [world[0]["captions"][0], "a dog sitting to the left of a red bicycle", "a man left the room"]
    for q in queries:
        hits = reranker.rank(q, paths)
        assert len(hits) == len(paths) and all(np.isfinite(h["score"]) for h in hits)
