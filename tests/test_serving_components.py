"""Serving components in-process (no Ray): token store, start-up refusal, miner masks, config, client helpers."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import int8_half_step

from edje.model.edje import load_checkpoint, read_checkpoint_config
from edje.model.scoring import decode_blobs
from edje.schemas.annotations import load_annotations
from edje.schemas.token_table import (
    TableMetadata,
    TableMismatchError,
    build_table,
    decode_tokens,
    read_metadata,
    read_token_tables,
    vector_matrix,
    write_token_table,
)
from edje.serving.config import DeploymentResources, ServeConfig
from edje.serving.first_stage import EmbeddingIndex
from edje.serving.miner import CaptionCorpus, HardNegativeMiner, load_caption_corpus
from edje.serving.random_corpus import write_random_corpus
from edje.storage.token_store import TokenStore, UnknownImageIds
from edje.training.miner_client import MinedNegatives, neighbour_batch


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny_edje_config):
    return write_random_corpus(str(tmp_path_factory.mktemp("serving-corpus")), tiny_edje_config, num_images=40)


@pytest.fixture(scope="module")
def store(corpus):
    return TokenStore.load(corpus.compressed_tables, read_checkpoint_config(corpus.checkpoint))


def test_store_gathers_what_the_tables_hold(corpus, store):
    table, meta = read_token_tables(corpus.compressed_tables)
    assert len(store) == 40 and store.image_ids == sorted(corpus.image_ids)
    ids = ["img_00007", "img_00031", "img_00007"]
    rows = [table.column("image_id").to_pylist().index(i) for i in ids]
    np.testing.assert_array_equal(store.gather(ids), decode_tokens(table, meta)[rows])
    got = store.gather_blobs(ids)
    torch.testing.assert_close(decode_blobs(meta, got.blob, got.scales), torch.from_numpy(store.gather(ids)))
    codec = meta.codec
    assert store.memory_bytes == 40 * (codec.bytes_per_image + 4 * meta.embed_dim)
    assert store.info()["images"] == 40 and store.info()["metadata"]["adapter_hash"] == meta.adapter_hash


def test_store_names_unknown_ids(store):
    with pytest.raises(UnknownImageIds, match="nope"):
        store.gather(["img_00001", "nope"])
    assert store.gather_blobs(["x", "img_00001", "x", "y"]).missing == ["x", "y"]


def test_store_tokens_score_like_the_adapter_output(corpus, store):
    """int8 tokens from the store score within quantization noise of the adapter's float output."""
    from edje.model.backbone import VisionBackbone
    model = load_checkpoint(corpus.checkpoint).eval()
    # The float adapter output, recomputed the way write_random_corpus made it (same seed, images, chunks).
    backbone = VisionBackbone.create(corpus.config.backbone)
    size = backbone.preprocess.size
    images = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (40, size, size, 3), dtype=np.uint8))
    with torch.no_grad():
        encoded = [backbone.encode(images[i:i + 32]) for i in range(0, 40, 32)]
        float_tokens = torch.cat([model.adapter(t) for t, _ in encoded])
    table, _ = read_token_tables(corpus.compressed_tables)
    stored_ids = table.column("image_id").to_pylist()
    stored_emb = vector_matrix(table.column("image_embedding"))[[stored_ids.index(i) for i in corpus.image_ids]]
    np.testing.assert_allclose(torch.cat([e for _, e in encoded]).numpy(), stored_emb, atol=1e-6)  # same images
    tokens = torch.from_numpy(store.gather(corpus.image_ids))
    # int8 keeps each token within half a step of the float value.
    err = (tokens - float_tokens).abs()
    assert err.max() > 0 and (err <= int8_half_step(float_tokens) + 1e-7).all()
    # Scores move by under 5% of their spread over the images of one caption (a random ITM head's
    # logits lie close together: std ~1e-3), and by under 1e-2 in absolute terms.
    with torch.no_grad():
        caps = [c for c in corpus.captions[:4] for _ in range(40)]
        s_int8 = model.encoder.score(caps, tokens.repeat(4, 1, 1)).view(4, 40)
        s_float = model.encoder.score(caps, float_tokens.repeat(4, 1, 1)).view(4, 40)
    diff = (s_int8 - s_float).abs()
    assert diff.max() < 1e-2 and (diff.amax(dim=1) < 0.05 * s_float.std(dim=1)).all()


def _table_with(corpus, tmp_path, **changes):
    meta = dataclasses.asdict(TableMetadata(kind="compressed", backbone="edje-tiny-clip", pretrained=corpus.backbone_weights,
                                            feature_layer="final", num_tokens=16, width=64, quantization="int8",
                                            embed_dim=128, adapter_hash=read_checkpoint_config(corpus.checkpoint)["adapter_hash"]))
    meta.update(changes)
    meta = TableMetadata(**meta)
    path = str(tmp_path / f"bad-{'-'.join(changes)}.parquet")
    rng = np.random.default_rng(0)
    write_token_table(build_table(meta, ["a", "b"], rng.normal(size=(2, meta.num_tokens, meta.width)).astype(np.float32),
                                  np.eye(2, meta.embed_dim, dtype=np.float32)), path)
    return path


@pytest.mark.parametrize("changes, field", [
    (dict(adapter_hash="0123456789abcdef"), "adapter_hash"),
    (dict(kind="raw", adapter_hash=None), "kind"),
    (dict(num_tokens=8), "num_tokens"),
    (dict(width=32), "width"),
    (dict(backbone="edje-tiny-timm"), "backbone"),
])
def test_store_refuses_tables_of_another_model(corpus, tmp_path, changes, field):
    bad = _table_with(corpus, tmp_path, **changes)
    with pytest.raises(TableMismatchError, match=field) as err:
        TokenStore.load([corpus.compressed_tables[0], bad], read_checkpoint_config(corpus.checkpoint))
    assert err.value.field == field


def test_store_keeps_one_row_per_duplicated_id(corpus):
    s = TokenStore.load([corpus.compressed_tables[0], corpus.compressed_tables[0]], read_checkpoint_config(corpus.checkpoint))
    assert len(s) == 20 and len(set(s.image_ids)) == 20


def test_annotations_and_raw_tables_make_one_caption_corpus(corpus):
    from edje.model.backbone import VisionBackbone

    ann = load_annotations(corpus.annotations)
    pairs = [(ann.image_ids[ann.caption_image[j]], c) for j, c in enumerate(ann.captions)]
    assert len(pairs) == 80 and pairs[0] == ("img_00000", corpus.captions[0])
    meta = read_metadata(corpus.raw_table)
    backbone = VisionBackbone.create(corpus.config.backbone)
    cc = load_caption_corpus([corpus.raw_table, corpus.annotations], meta, backbone)
    assert len(cc.captions) == 40 + 80
    # The raw table's stored embedding of a caption equals the text tower's embedding of the same caption.
    np.testing.assert_allclose(cc.embeddings[0], cc.embeddings[40], atol=1e-5)


def _toy_miner():
    # 6 images on a circle; captions near their images; img_2 also carries img_0's caption text.
    angles = np.linspace(0, np.pi / 2, 6)
    img = np.stack([np.cos(angles), np.sin(angles)], 1).astype(np.float32)
    ids = [f"img_{i}" for i in range(6)]
    caps = [f"caption {i}" for i in range(6)] + ["caption 0", "caption 1 again"]
    cap_ids = ids + ["img_2", "img_1"]
    cap_emb = np.concatenate([img, img[[2, 1]]])
    return HardNegativeMiner(ids, img, CaptionCorpus(caps, cap_ids, cap_emb)), img, ids


def test_miner_masks_positive_same_image_and_identical_captions():
    miner, img, ids = _toy_miner()
    neg_img, neg_cap = miner.mine(["img_0"], ["caption 0"], img[[0]], want=3)
    got_images = [ids[c.row] for c in neg_img[0]]
    # img_0 is the positive, img_2 carries an identical caption: both are false negatives.
    assert got_images == ["img_1", "img_3", "img_4"]
    got_caps = [miner.corpus.captions[c.row] for c in neg_cap[0]]
    assert "caption 0" not in got_caps and len(set(got_caps)) == 3
    assert set(got_caps[:2]) == {"caption 1", "caption 1 again"}  # the two nearest to img_0 (tied)
    sims = [c.similarity for c in neg_img[0]]
    assert sims == sorted(sims, reverse=True)


def test_miner_widens_the_search_and_returns_fewer_when_the_corpus_runs_out():
    miner, img, ids = _toy_miner()
    neg_img, neg_cap = miner.mine(["img_0"], ["caption 0"], img[[0]], want=10)
    assert len(neg_img[0]) == 4  # 6 images - positive - the image with the identical caption
    assert len({miner.corpus.captions[c.row] for c in neg_cap[0]}) == len(neg_cap[0])
    assert miner.missing_images(["img_0", "zzz", "zzz"]) == ["zzz"]


def test_miner_reuses_stored_caption_embeddings_and_needs_a_tower_for_new_ones():
    miner, img, _ = _toy_miner()
    np.testing.assert_array_equal(miner.caption_embeddings(["caption 3"]), img[[3]])
    with pytest.raises(ValueError, match="text tower"):
        miner.caption_embeddings(["never seen"])


def test_embedding_index_is_inner_product():
    v = np.eye(4, dtype=np.float32)
    idx = EmbeddingIndex(list("abcd"), v)
    scores, rows = idx.search(np.array([[0.1, 0.9, 0.0, 0.2]], np.float32), 2)
    assert [idx.ids[r] for r in rows[0]] == ["b", "d"]
    np.testing.assert_allclose(scores[0], [0.9, 0.2], rtol=1e-6)


@pytest.mark.parametrize("factory", ["Flat", "HNSW8"])
def test_embedding_index_gives_rows_back_and_excludes_a_query_image(factory):
    """Mixed-modal search's first-stage pieces: a stored vector by id (exact, whatever the index), exclusion."""
    from edje.serving.first_stage import combine_query

    rng = np.random.default_rng(1)
    v = rng.normal(size=(30, 8)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    ids = [f"i{j}" for j in range(30)]
    idx = EmbeddingIndex(ids, v, factory)
    got, missing = idx.vectors(["i4", "i9"])
    np.testing.assert_array_equal(got, v[[4, 9]])  # the table's vectors, not an index's approximation
    assert missing == [] and idx.vectors(["nope", "i1", "nope"]) == (None, ["nope"])
    scores, rows = idx.search(v[[4, 9]], 5, exclude=["i4", None])
    assert 4 not in rows[0] and rows[1][0] == 9  # excluded for the first query only
    full_s, full_r = idx.search(v[[4]], 6)
    np.testing.assert_array_equal(rows[0], full_r[0][1:])  # the rest keep their order and scores
    np.testing.assert_allclose(scores[0], full_s[0][1:], rtol=1e-6)
    _, rows = idx.search(v[[4]], 100, exclude=["i4"])  # more than the index holds: all but the excluded one
    assert rows.shape == (1, 30) and 4 not in rows[0]
    if factory == "Flat":  # exact; HNSW may miss some rows of a full-corpus search
        assert sorted(rows[0][rows[0] >= 0]) == [r for r in range(30) if r != 4]
    idx.add(["live"], -v[:1])  # a live image is found by id too
    np.testing.assert_allclose(idx.vectors(["live"])[0], -v[:1])
    q = combine_query(v[:2], v[2:4], 0.25)
    expected = 0.25 * v[:2] + 0.75 * v[2:4]
    np.testing.assert_allclose(q, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(combine_query(v[:2], None, 0.5), v[:2], rtol=1e-6)
    assert np.isfinite(combine_query(v[:1], -v[:1], 0.5)).all()  # opposite directions: zero, not NaN


def test_neighbour_batch_puts_anchors_first_then_neighbours_round_robin():
    mined = MinedNegatives(image_ids=[["x", "y"], ["x", "z"]], captions=[[], []], caption_image_ids=[[], []])
    assert neighbour_batch(["a", "b"], mined, 4) == ["a", "b", "x", "y"]
    assert neighbour_batch(["a", "b"], mined, 10) == ["a", "b", "x", "y", "z"]


def test_serve_config_checks_and_parses():
    with pytest.raises(ValueError, match="token_tables"):
        ServeConfig(checkpoint="ckpt")
    with pytest.raises(ValueError, match="miner"):
        ServeConfig()
    cfg = ServeConfig.from_dict({"checkpoint": "c", "token_tables": "t.parquet", "reranker": {"num_replicas": 2, "num_gpus": 1}})
    assert cfg.token_tables == ("t.parquet",) and cfg.reranker == DeploymentResources(num_replicas=2, num_gpus=1)
    assert cfg.image_tables == ("t.parquet",)
    with pytest.raises(ValueError, match="unknown fields"):
        ServeConfig.from_dict({"checkpoint": "c", "token_tables": ["t"], "max_docs": 3})
    assert cfg.reranker.options()["ray_actor_options"] == {"num_cpus": 0.0, "num_gpus": 1}


def test_serve_job_flags_override_the_config_file(tmp_path, monkeypatch):
    import yaml

    from edje.jobs.serve import config_from_args, parse

    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"args": {"checkpoint": "c", "token_tables": ["a.parquet"], "max_documents": 50}}))
    cfg = config_from_args(parse(["--config", str(path), "--reranker-replicas", "3", "--no-batching"]))
    assert cfg.max_documents == 50 and cfg.reranker.num_replicas == 3 and cfg.reranker.num_cpus == 1.0
    assert cfg.dynamic_batching is False
    monkeypatch.setenv("EDJE_API_TOKEN", "s3cret")
    assert cfg.resolved_auth_token() == "s3cret"


def test_app_refuses_mismatched_tables_at_start_up(corpus, tmp_path, tiny_edje_config):
    """`serve run`'s builder (and jobs/serve.py's build) refuse tables of another adapter before deploying anything."""
    from edje.serving.app import build_app

    other = write_random_corpus(str(tmp_path / "other"), tiny_edje_config, num_images=4, num_tables=1, seed=1)
    args = {"checkpoint": corpus.checkpoint, "token_tables": [corpus.compressed_tables[0], other.compressed_tables[0]]}
    with pytest.raises(TableMismatchError, match="adapter_hash") as err:
        build_app(args)
    assert other.compressed_tables[0] in str(err.value)
    build_app({**args, "token_tables": corpus.compressed_tables})  # the matching tables build


def test_one_image_id_rule_for_evaluation_and_the_miner(tmp_path, corpus):
    """An entry without image_id is named by its image path as written, by every reader."""
    import json

    from edje.model.backbone import VisionBackbone

    entries = [{"image": "images/a.jpg", "caption": ["a red circle"]},
               {"image": "images/b.jpg", "caption": "a blue square", "image_id": "b-id"}]
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(entries))
    assert load_annotations(path).image_ids == ["images/a.jpg", "b-id"]
    meta = read_metadata(corpus.raw_table)
    cc = load_caption_corpus([str(path)], meta, VisionBackbone.create(corpus.config.backbone))
    assert cc.image_ids == ["images/a.jpg", "b-id"]
