"""The pretrained-text first-stage study (research/pretrained_text_first_stage.py): the head learns to find an image
from frozen token states, its cosine mixes into a capture's first stage, and the shipped rule reads as the checkpoint
fitted it."""
from __future__ import annotations

import numpy as np
import torch

from edje.research.confidence_fusion import Capture
from edje.research.pretrained_text_first_stage import caption_states, embed, first_stage_alone, mixed, shipped_rule, train_head
from edje.training.language_model import default_language_model


def test_the_head_finds_each_captions_image_from_its_token_states():
    rng = np.random.default_rng(0)
    images = rng.normal(size=(40, 8)).astype(np.float32)
    images /= np.linalg.norm(images, axis=1, keepdims=True)
    caption_image = np.repeat(np.arange(40), 2)
    # Each caption's states: noise, with its image's vector (mixed by a fixed map) in one of its first three tokens.
    mix = rng.normal(size=(8, 16)).astype(np.float32)
    states = rng.normal(scale=0.3, size=(80, 6, 16)).astype(np.float16)
    where = rng.integers(0, 3, size=80)
    states[np.arange(80), where] += (images[caption_image] @ mix).astype(np.float16)
    mask = np.ones((80, 6), bool)
    mask[:, 5] = False
    head = train_head(states, mask, caption_image, images, epochs=60, batch=20, lr=3e-3, log=lambda s: None)
    found = np.argmax(embed(head, states, mask) @ images.T, axis=1)
    assert np.mean(found == caption_image) >= 0.8  # chance: 1/40


def test_mixing_the_heads_cosine_into_a_capture():
    images = np.eye(4, dtype=np.float32)
    idx = np.array([[0, 1, 2], [3, 2, 1]])
    sim = np.array([[0.9, 0.5, 0.1], [0.8, 0.7, 0.2]], np.float32)
    c = Capture(sim, idx, np.zeros((2, 3), np.float32), [np.array([1]), np.array([3])], None, None, None,
                ["a", "b"], images)
    text = np.array([[0, 1, 0, 0], [0, 0, 0, 1]], np.float32)  # the head finds each query's answer
    np.testing.assert_allclose(mixed(c, text, 0.0).sim, sim)
    np.testing.assert_allclose(mixed(c, text, 1.0).sim, [[0, 1, 0], [1, 0, 0]])
    assert first_stage_alone(c)["all"]["r1"] == 50.0
    assert first_stage_alone(mixed(c, text, 1.0))["all"]["r1"] == 100.0


def test_caption_states_of_the_packaged_language_model_and_the_shipped_rule():
    states, mask = caption_states(["a small dog", "dog (small) left of cat (large)"], default_language_model(),
                                  max_length=16)
    assert states.shape == (2, 16, 384) and states.dtype == np.float16
    assert mask[0].sum() < mask[1].sum() <= 16 and mask[:, 0].all()
    rule = shipped_rule("checkpoints/edje-open-c16")
    assert rule["feature"] == "top" and rule["w_hi"] == 64 and rule["w_lo"] == 32 and 0.5 < rule["threshold"] < 1


def test_the_epoch_the_validation_scores_best_is_the_one_kept():
    rng = np.random.default_rng(1)
    images = rng.normal(size=(8, 4)).astype(np.float32)
    states = rng.normal(size=(8, 3, 6)).astype(np.float16)
    scores, seen, logs = iter([1.0, 5.0, 2.0]), [], []

    def validate(head):
        seen.append({k: v.clone() for k, v in head.state_dict().items()})
        return next(scores)
    head = train_head(states, np.ones((8, 3), bool), np.arange(8), images, epochs=3, batch=4, validate=validate,
                      log=logs.append)
    assert logs[-1] == "kept epoch 2 (validation 5.00)"
    for k, v in head.state_dict().items():
        assert torch.equal(v, seen[1][k])
    assert not all(torch.equal(v, seen[2][k]) for k, v in head.state_dict().items())
