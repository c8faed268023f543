"""The never-trained-token study (research/unseen_tokens.py): which ids the training captions use, dropping the
others from a query, and the three readings of a text tower on a real (random-weight) backbone."""
from __future__ import annotations

import json

import numpy as np
import torch

from edje.model.backbone import VisionBackbone
from edje.research.unseen_tokens import drop_ids, embed, recall_by_template, strip_world, trained_token_ids
from edje.schemas.config import BackboneConfig


def _backbone():
    torch.manual_seed(0)
    return VisionBackbone.create(BackboneConfig(name="edje-tiny-convvit-128", random_weights=True))


def test_dropping_a_never_trained_token_reads_the_query_as_if_it_were_not_there():
    b = _backbone()
    keep = trained_token_ids(b.tokenizer, ["a small dog left of a large cat"])
    ids = b.tokenizer(["dog (small) left of cat"])
    dropped = drop_ids(ids, keep)
    assert dropped.shape == ids.shape and torch.equal(dropped, b.tokenizer(["dog small left of cat"]))
    bracketed, plain = "dog (small) left of cat", "dog small left of cat"
    as_is = embed(b.clip, b.tokenizer, [bracketed, plain], keep, "as is")
    assert not np.allclose(as_is[0], as_is[1], atol=1e-4)
    out = embed(b.clip, b.tokenizer, [bracketed, plain], keep, "dropped")
    np.testing.assert_allclose(out[0], out[1], atol=1e-5)
    # Zeroing changes only queries with a never-trained token, and leaves the table as it was.
    before = b.clip.token_embedding.weight.detach().clone()
    zeroed = embed(b.clip, b.tokenizer, [bracketed, plain], keep, "zeroed")
    np.testing.assert_allclose(zeroed[1], as_is[1], atol=1e-5)
    assert not np.allclose(zeroed[0], as_is[0], atol=1e-4)
    assert torch.equal(before, b.clip.token_embedding.weight)


def test_recall_by_template_and_the_stripped_world(tmp_path):
    table = recall_by_template(np.array([0, 3, 12, 0]), ["first", "1/h0", "1/h0", "2/h1"])
    assert table["1/h0"] == {"queries": 2, "R@1": 0.0, "R@10": 50.0}
    assert table["held-out"] == {"queries": 3, "R@1": 33.3, "R@10": 66.7}
    world = tmp_path / "w"
    (world / "images").mkdir(parents=True)
    (world / "flickr30k_test_first1000.json").write_text(json.dumps(
        [{"image": "images/a.jpg", "image_id": "a", "caption": ["dog (small) left of cat (large)", "a dog"]}]))
    (world / "world.json").write_text(json.dumps({"images": [{"image_id": "a", "captions": ["dog (small)  x"]}]}))
    assert strip_world(world, "()", tmp_path / "out") == 1
    out = json.loads((tmp_path / "out" / "flickr30k_test_first1000.json").read_text())
    assert out[0]["caption"] == ["dog small left of cat large", "a dog"]
    assert json.loads((tmp_path / "out" / "world.json").read_text())["images"][0]["captions"] == ["dog small x"]
    assert (tmp_path / "out" / "images").resolve() == (world / "images").resolve()
