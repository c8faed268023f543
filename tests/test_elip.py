"""The ELIP baseline: prompt insertion into the timm ViT, mapper training, re-ranking evaluation."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edje.model.backbone import VisionBackbone
from edje.research.elip_eval import ELIPEvalConfig, caption_embeddings, evaluate_elip, image_inputs
from edje.research.elip_model import ELIPConfig, ELIPReranker, encode_prompted, load_elip, patch_tokens
from edje.research.elip_training import ELIPTrainConfig, infonce_loss, train_elip, train_step
from edje.sampleworld.world import WorldConfig, generate
from edje.schemas.annotations import load_annotations

ROOT = Path(__file__).resolve().parent.parent
# The committed embedded-default backbone: a random one embeds every image alike, and nothing can be learned over it.
TINY = ELIPConfig(backbone="edje-tiny-convvit", pretrained=str(ROOT / "checkpoints" / "edje-tiny-convvit-sw.safetensors"),
                  num_prompts=4, hidden_dim=128)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tests run beside other work: one thread, restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model() -> ELIPReranker:
    torch.manual_seed(0)
    return ELIPReranker(TINY, VisionBackbone.create(TINY.backbone_config()))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny world at the backbone's 64 px: 4 train families, 2 val, 2 test."""
    return generate(WorldConfig(seed=5, n_train=16, n_val=8, n_test=8, image_size=64, captions_per_image=2),
                    tmp_path_factory.mktemp("elip_world"))


def images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, 64, 64, 3), dtype=np.uint8))


def test_unprompted_pass_is_the_backbones_image_embedding(model):
    x = images(3)
    tokens = patch_tokens(model.backbone, x)
    own = model.backbone.encode_image(x)
    assert tokens.shape == (3, 64, model.backbone.width)
    assert torch.equal(encode_prompted(model.backbone, tokens, None), own)
    empty = tokens.new_zeros(3, 0, tokens.shape[2])  # zero prompt vectors *inserted*: still the same pass
    assert torch.equal(encode_prompted(model.backbone, tokens, empty), own)


def test_prompted_pass_is_open_clips_forward_with_prompts_before_the_blocks(model):
    """The reference is open_clip's own encode_image, hooked: prompts prepended to what enters the blocks,
    their outputs dropped after the final norm, before timm's pooling and open_clip's head."""
    x = images(2, seed=2)
    trunk = model.backbone.visual.trunk
    prompts = torch.randn(2, 3, model.backbone.width)
    hooks = [trunk.blocks.register_forward_pre_hook(lambda _m, args: (torch.cat([prompts, args[0]], dim=1),)),
             trunk.norm.register_forward_hook(lambda _m, _args, out: out[:, prompts.shape[1]:])]
    try:
        reference = model.backbone.encode_image(x)
    finally:
        for h in hooks:
            h.remove()
    ours = encode_prompted(model.backbone, patch_tokens(model.backbone, x), prompts)
    assert torch.allclose(ours, reference, atol=1e-6)
    assert (ours - model.backbone.encode_image(x)).abs().max() > 1e-3  # the prompts matter


def test_prompts_act_through_attention_and_pair_with_their_query(model):
    x = images(4, seed=1)
    tokens = model.patch_tokens(x)
    text = torch.nn.functional.normalize(torch.randn(2, model.backbone.embed_dim), dim=-1)
    prompted = model.prompted_embeddings(text, tokens.view(2, 2, *tokens.shape[1:]))
    plain = encode_prompted(model.backbone, tokens, None).view(2, 2, -1)
    assert (prompted - plain).abs().max() > 1e-3  # the prompts change the image embedding ...
    assert torch.allclose(prompted.norm(dim=-1), torch.ones(2, 2), atol=1e-5)
    # ... and each (query, candidate) pair is the query's prompts on that candidate, whatever the batch holds
    alone = model.prompted_embeddings(text[1:], tokens[2:3].unsqueeze(0))  # query 1, candidate 0 = image 2
    assert torch.allclose(alone[0, 0], prompted[1, 0], atol=1e-5)
    # only the mapper learns
    loss = infonce_loss(model, text, tokens[:2], scale=10.0)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.mapper.parameters())
    assert all(p.grad is None for p in model.backbone.parameters())
    model.mapper.zero_grad(set_to_none=True)


def test_training_steps_lower_the_loss_on_a_family(world):
    torch.manual_seed(0)
    model = ELIPReranker(TINY, VisionBackbone.create(TINY.backbone_config()))
    ann = load_annotations(world.annotations["train"])
    tokens, _ = image_inputs(model, ann.image_paths[:8])  # two families: each image beside its three twins
    model.match_token_scale(tokens)
    text = caption_embeddings(model, [ann.captions_of(i)[0] for i in range(8)])
    before = [p.clone() for p in model.backbone.parameters()]
    opt = torch.optim.AdamW(model.mapper.parameters(), lr=3e-3)
    losses = [train_step(model, opt, text, tokens, scale=16.0) for _ in range(12)]
    assert losses[-1] < 0.95 * losses[0] and max(losses[-3:]) < min(losses[:3]), losses
    assert all(torch.equal(a, b) for a, b in zip(before, model.backbone.parameters()))  # the backbone is frozen


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("elip_run")
    cfg = ELIPTrainConfig(train_annotations=str(world.annotations["train"]), val_annotations=str(world.annotations["val"]),
                          output=str(out), elip=TINY, train_images=16, batch_size=4, cluster_size=4, steps=4,
                          lr=3e-3, warmup_steps=1, eval_every=2, val_queries=8, k=4, seed=0,
                          logit_scale=10.0, learn_scale=True)
    torch.manual_seed(1)
    model = ELIPReranker(TINY, VisionBackbone.create(TINY.backbone_config()))
    return out, model, train_elip(cfg, log=lambda _: None, model=model)


def test_training_run_keeps_the_best_val_step(trained):
    out, model, record = trained
    assert [row["step"] for row in record["history"]] == [0, 2, 4]
    scales = [row["logit_scale"] for row in record["history"][1:]]
    assert all(s != 10.0 for s in scales) and scales[0] != scales[1]  # the temperature is learned
    best = max(record["history"], key=lambda r: (r["val_t2i"]["r1"], -r["step"]))
    assert record["kept_step"] == best["step"]
    saved = json.loads((out / "elip.json").read_text())
    assert saved["config"]["num_prompts"] == 4 and saved["kept_step"] == record["kept_step"]
    again = load_elip(out, backbone=model.backbone)
    assert all(torch.equal(a, b) for a, b in zip(again.mapper.state_dict().values(), model.mapper.state_dict().values()))


def test_evaluation_reports_recall_binding_and_cost(world, trained):
    out, _, _ = trained
    m = evaluate_elip(ELIPEvalConfig(checkpoint=str(out), annotations=str(world.annotations["test"]), k=4,
                                     max_queries_per_image=1, output=str(out / "eval")))
    t2i = m["t2i"]
    for stage in ("first_stage", "reranked"):
        assert set(t2i[stage]) == {"r1", "r5", "r10"} and all(0 <= v <= 100 for v in t2i[stage].values())
    assert set(t2i["within_family"]) == {"first_stage", "reranked", "by_kind"}
    assert m["queries"] == 8 and m["cost"]["backbone_passes_per_query"] == 4 and m["cost"]["pairs"] == 32
    assert m["cost"]["pairs_per_s"] > 0 and len(m["cost"]["loadavg_1_5_15"]) == 3
    assert json.loads((out / "eval" / "metrics.json").read_text())["t2i"] == t2i


def test_per_candidate_prompts_read_each_candidates_embedding_and_train(world, tmp_path):
    """per_candidate: the mapper reads [t, v, t*v], so one query's candidates get different prompts; it trains,
    saves and loads like the text-only mapper, and evaluation hands it the candidates' embeddings."""
    cfg = ELIPConfig(**{**TINY.__dict__, "per_candidate": True})
    torch.manual_seed(0)
    model = ELIPReranker(cfg, VisionBackbone.create(cfg.backbone_config()))
    ann = load_annotations(world.annotations["train"])
    tokens, emb = image_inputs(model, ann.image_paths[:8])
    model.match_token_scale(tokens)
    text = caption_embeddings(model, [ann.captions_of(i)[0] for i in range(8)])
    cand = tokens[:2].unsqueeze(0)  # one query, two candidates
    t, v = F.normalize(text[:1], dim=-1).expand(2, -1), emb[:2]
    prompts = model.mapper(torch.cat([t, v, t * v], dim=-1))
    assert not torch.allclose(prompts[0], prompts[1])
    with torch.no_grad():  # embeddings computed inside when not given: the same scores
        assert torch.allclose(model.score(text[:1], cand, emb[:2].unsqueeze(0)), model.score(text[:1], cand), atol=1e-5)
    opt = torch.optim.AdamW(model.mapper.parameters(), lr=3e-3)
    losses = [train_step(model, opt, text, tokens, 16.0, emb) for _ in range(12)]
    assert losses[-1] < losses[0], losses
    model.save(tmp_path / "pc")
    again = load_elip(tmp_path / "pc", backbone=model.backbone)
    assert again.config.per_candidate and again.mapper.net[0].in_features == 3 * model.backbone.embed_dim
    out = evaluate_elip(ELIPEvalConfig(checkpoint=str(tmp_path / "pc"), annotations=str(world.annotations["test"]), k=4,
                                       max_queries_per_image=1))
    assert out["cost"]["pairs"] == 32 and 0 <= out["t2i"]["reranked"]["r1"] <= 100
