"""Weights by the names users pass, through the real `huggingface_hub` client against a loopback hub.

The hub (tests/hub_server.py) holds repositories made from what the project ships (tests/hub_repos.py). In this
process the client's endpoint, cache and offline flag are set as HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE would set
them at import; nothing reaches beyond loopback.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import torch
from hub_repos import BACKBONE_REPO, CLASS_TOKEN_REPO, LANGUAGE_MODEL_REPO, publish_shipped
from hub_server import LoopbackHub

from edje.model.backbone import VisionBackbone, default_feature_layer
from edje.model.backbone_weights import pin, resolve
from edje.schemas.config import BackboneConfig
from edje.schemas.shipped import REPO_ROOT, SHIPPED_BACKBONE_WEIGHTS
from edje.storage.hub import CheckpointNotFound, hub_env
from edje.training.language_model import pack, resolve_language_model, unpack

SHIPPED = REPO_ROOT / SHIPPED_BACKBONE_WEIGHTS["edje-tiny-convvit"]


@pytest.fixture(scope="module")
def hub():
    with LoopbackHub() as h:
        h.commits = publish_shipped(h)
        yield h


@pytest.fixture
def online(hub, tmp_path, monkeypatch):
    """The client as HF_ENDPOINT=<the loopback hub>, HF_HOME=<an empty folder> and no offline variable set it up."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hub.requests.clear()
    return constants


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def test_an_hf_hub_backbone_loads_the_shipped_weights_pinned_to_its_commit(hub, online):
    name = f"hf-hub:{BACKBONE_REPO}"
    layer = default_feature_layer(name)  # from the repository's open_clip_config.json
    assert layer == "final" and default_feature_layer(f"hf-hub:{CLASS_TOKEN_REPO}") == "penultimate"
    pinned = pin(BackboneConfig(name, feature_layer=layer))
    # What a table records: the name, the hub commit, the weights' sha256 (the shipped file's, byte for byte).
    assert pinned.revision == hub.commits[BACKBONE_REPO] and pinned.weights_sha256 == _sha256(SHIPPED)
    assert ("GET", f"/{BACKBONE_REPO}/resolve/{pinned.revision}/open_clip_model.safetensors") in hub.requests
    from_hub = VisionBackbone.create(pinned)
    local = VisionBackbone.create(BackboneConfig("edje-tiny-convvit", str(SHIPPED), layer))
    images = torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8)
    for a, b in zip(from_hub.encode(images), local.encode(images)):
        assert torch.equal(a, b)
    assert torch.equal(from_hub.encode_text(["a red circle"]), local.encode_text(["a red circle"]))
    assert from_hub.preprocess == local.preprocess


def test_random_weights_are_random_and_fetch_no_weights(hub, online):
    name = f"hf-hub:{BACKBONE_REPO}"
    random = pin(BackboneConfig(name, random_weights=True))
    assert random.revision == hub.commits[BACKBONE_REPO] and random.weights_sha256 is None
    assert not any(path.endswith(".safetensors") for _, path in hub.requests)
    torch.manual_seed(0)
    untrained = VisionBackbone.create(random)
    trained = VisionBackbone.create(pin(BackboneConfig(name)))
    images = torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8)
    assert not torch.allclose(untrained.encode_image(images), trained.encode_image(images), atol=1e-3)


def test_a_registry_tag_is_fetched_from_its_hub_repository_and_pinned(hub, online, monkeypatch):
    import open_clip.pretrained as pretrained

    # A tag in open_clip's registry that names a hub repository, as open_clip's own tags do ("org/name/").
    monkeypatch.setitem(pretrained._PRETRAINED, "edje-tiny-convvit", {"sw": pretrained._pcfg(hf_hub=f"{BACKBONE_REPO}/")})
    cfg = pin(BackboneConfig("edje-tiny-convvit", "sw"))
    assert cfg.revision == hub.commits[BACKBONE_REPO] and cfg.weights_sha256 == _sha256(SHIPPED)
    images = torch.randint(0, 256, (1, 64, 64, 3), dtype=torch.uint8)
    local = VisionBackbone.create(BackboneConfig("edje-tiny-convvit", str(SHIPPED)))
    assert torch.equal(VisionBackbone.create(cfg).encode_image(images), local.encode_image(images))
    # A recorded commit is the one loaded: an unknown one is refused by the hub, in one line.
    with pytest.raises(CheckpointNotFound, match=r"^backbone edje-tiny-convvit \(pretrained sw\) cannot be loaded: "
                                                 r"not found \(HTTP 404\): the repository has no such revision$"):
        resolve(BackboneConfig("edje-tiny-convvit", "sw", revision="f" * 40))


def test_recorded_weights_that_changed_on_the_hub_are_refused(hub, online):
    pinned = pin(BackboneConfig(f"hf-hub:{BACKBONE_REPO}"))
    with pytest.raises(ValueError, match="was recorded: the file was replaced"):
        resolve(BackboneConfig(pinned.name, revision=pinned.revision, weights_sha256="0" * 64))


def test_missing_models_fail_with_one_line_that_says_why(hub, online, tmp_path, monkeypatch):
    def error(cfg: BackboneConfig) -> str:
        with pytest.raises(CheckpointNotFound) as e:
            resolve(cfg)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert error(BackboneConfig("hf-hub:edje-ray/no-such-model")) == (
        f"backbone hf-hub:edje-ray/no-such-model cannot be loaded: not found (HTTP 404): no such repository at {hub.url}")
    config = hub.repos[BACKBONE_REPO].files["open_clip_config.json"].source
    hub.add("edje-ray/gated", {"open_clip_config.json": config}, token="hf_secret")
    assert error(BackboneConfig("hf-hub:edje-ray/gated")).startswith(
        "backbone hf-hub:edje-ray/gated cannot be loaded: no access (HTTP 401): the repository is gated or private")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    assert "no access (HTTP 403)" in error(BackboneConfig("hf-hub:edje-ray/gated", random_weights=True))
    monkeypatch.setenv("HF_TOKEN", "hf_secret")  # the right token: the gated repository is readable
    assert resolve(BackboneConfig("hf-hub:edje-ray/gated", random_weights=True)).revision == hub.repos["edje-ray/gated"].commit
    with pytest.raises(CheckpointNotFound, match=r"^language model edje-ray/nothing-here cannot be loaded: not found"):
        resolve_language_model("edje-ray/nothing-here")
    # Offline with nothing cached, and a hub that does not answer with nothing cached.
    online.HF_HUB_OFFLINE = True
    assert error(BackboneConfig(f"hf-hub:{BACKBONE_REPO}")) == (
        f"backbone hf-hub:{BACKBONE_REPO} cannot be loaded: HF_HUB_OFFLINE is set and the hub cache "
        f"({online.HF_HUB_CACHE}) holds no copy of it")
    online.HF_HUB_OFFLINE = False
    down = LoopbackHub()
    down.start()
    url = down.url
    down.stop()
    online.ENDPOINT, online.HUGGINGFACE_CO_URL_TEMPLATE = url, url + "/{repo_id}/resolve/{revision}/{filename}"
    # (A backbone's file download retries a refused connection for ~23 s first, as the client does for users:
    # tests/test_hub_jobs.py sees that line from the jobs.)
    with pytest.raises(CheckpointNotFound) as e:
        resolve_language_model(LANGUAGE_MODEL_REPO)
    assert str(e.value) == (f"language model {LANGUAGE_MODEL_REPO} cannot be loaded: the hub ({url}) could not be "
                            f"reached and the hub cache ({online.HF_HUB_CACHE}) holds no copy of it")


def test_offline_from_a_populated_cache(hub, online):
    name = f"hf-hub:{BACKBONE_REPO}"
    pinned = pin(BackboneConfig(name, feature_layer=default_feature_layer(name)))
    lm = resolve_language_model(LANGUAGE_MODEL_REPO)
    online.HF_HUB_OFFLINE = True
    hub.requests.clear()
    assert pin(BackboneConfig(name, feature_layer=pinned.feature_layer)) == pinned
    assert VisionBackbone.create(pinned).token_shape == (64, 128)
    assert resolve_language_model(LANGUAGE_MODEL_REPO) == lm
    assert hub.requests == []  # offline means no request at all


def test_a_language_model_by_hub_id_is_resolved_once_and_shipped_as_files(hub, online, tmp_path):
    from transformers import AutoTokenizer, BertConfig

    from edje.training.language_model import default_language_model

    lm = resolve_language_model(LANGUAGE_MODEL_REPO)
    assert lm.revision == hub.commits[LANGUAGE_MODEL_REPO] and os.path.isabs(lm.folder)
    files = pack(lm.folder)
    assert set(files) >= {"config.json", "vocab.txt", "model.safetensors"}
    assert "model.safetensors" not in pack(lm.folder, weights=False)
    folder = unpack(files, str(tmp_path / "node"))
    assert unpack(files, str(tmp_path / "node")) == folder  # one copy per node, by content
    default = default_language_model()
    assert BertConfig.from_pretrained(folder).to_dict() == BertConfig.from_pretrained(default).to_dict()
    words = "a small red circle left of a big blue square"
    assert AutoTokenizer.from_pretrained(folder)(words)["input_ids"] == AutoTokenizer.from_pretrained(default)(words)["input_ids"]
    # A folder is taken as it is, made absolute (workers run elsewhere).
    rel = os.path.relpath(default)
    assert resolve_language_model(rel).folder == default and resolve_language_model(rel).revision is None


def test_edje_config_starts_from_a_hub_language_model(hub, online):
    from edje.schemas.token_table import TableMetadata
    from edje.training.config import ModelSpec
    from edje.training.model_init import build_model

    meta = TableMetadata(kind="raw", backbone=f"hf-hub:{BACKBONE_REPO}", pretrained=None, feature_layer="final",
                         num_tokens=64, width=128, quantization="fp16", embed_dim=128,
                         pretrained_sha256=_sha256(SHIPPED), backbone_revision=hub.commits[BACKBONE_REPO])
    spec = ModelSpec(adapter="compressed", num_queries=4, adapter_hidden=32, adapter_heads=4, encoder_layers=1,
                     language_model=LANGUAGE_MODEL_REPO)
    model = build_model(spec, meta)
    assert model.config.backbone == meta.backbone_config()  # the checkpoint records the backbone as loaded
    from transformers import BertForMaskedLM

    real = BertForMaskedLM.from_pretrained(resolve_language_model(LANGUAGE_MODEL_REPO).folder)
    np.testing.assert_array_equal(model.encoder.bert.bert.encoder.layer[0].attention.self.query.weight.detach().numpy(),
                                  real.bert.encoder.layer[0].attention.self.query.weight.detach().numpy())


def test_serving_and_evaluation_rebuild_the_backbone_a_table_names(hub, online):
    import dataclasses

    from edje.schemas.token_table import TableMetadata
    from edje.serving.first_stage import load_backbone

    meta = TableMetadata(kind="compressed", backbone=f"hf-hub:{BACKBONE_REPO}", pretrained=None, feature_layer="final",
                         num_tokens=16, width=64, quantization="int8", embed_dim=128, adapter_hash="x",
                         pretrained_sha256=_sha256(SHIPPED), backbone_revision=hub.commits[BACKBONE_REPO])
    hub.requests.clear()
    text = load_backbone(meta, device="cpu").encode_text(["a blue square"])  # the first stage's query tower
    local = VisionBackbone.create(BackboneConfig("edje-tiny-convvit", str(SHIPPED)))
    assert torch.equal(text, local.encode_text(["a blue square"]))
    assert ("GET", f"/{BACKBONE_REPO}/resolve/{meta.backbone_revision}/open_clip_model.safetensors") in hub.requests
    with pytest.raises(ValueError, match="was recorded: the file was replaced"):  # other bytes than the table's
        load_backbone(dataclasses.replace(meta, pretrained_sha256="0" * 64), device="cpu")


def test_ray_workers_get_the_drivers_hub_settings(monkeypatch):
    for k in ("HF_HUB_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HOME", "/shared/hf")
    assert hub_env() == {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": "/shared/hf"}  # nothing forced, nothing else
