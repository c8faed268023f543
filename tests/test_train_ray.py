"""Pretraining on Ray Train over tables written by the encode pipeline: two CPU workers, DDP,
checkpoints every N steps, and a run killed mid-way that resumes from its checkpointed step."""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # Ray Train / Serve on a local cluster

ROOT = Path(__file__).resolve().parent.parent
PRETRAIN = [sys.executable, str(ROOT / "jobs" / "pretrain.py")]
# A run that a test kills mid-run keeps Ray Train's own 2 s report collection (the suite's is 0.25 s, conftest), so
# that it is still running when the kill lands.
RAY_OWN_POLL = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "2"}


@pytest.fixture(scope="module")
def pipeline_tables(ray_local, tmp_path_factory):
    """Raw token tables of a 48-image sample world, written by the encode pipeline (jobs/encode_cc12m.py)."""
    from edje.pipeline.job import run_encode_job
    from edje.schemas.encode_job import EncodeJobConfig
    from edje.schemas.shipped import DEFAULT_BACKBONE
    from edje.schemas.weights import find_weights

    root = tmp_path_factory.mktemp("trainworld")
    # The job's default weights (jobs/encode_cc12m.py resolves them), so that the tables can be checked against them.
    summary = run_encode_job(EncodeJobConfig(output=str(root / "enc"), world_dir=str(root / "world"),
                                             world_images=48, batch_size=16, shard_size=24,
                                             pretrained=find_weights(backbone=DEFAULT_BACKBONE)))
    assert summary["complete"] and summary["images_ok"] == summary["images_in"] > 40
    return root / "enc" / "tables"


def _checkpoints(storage: Path, name: str):
    """(step, dir) of every complete checkpoint of a run."""
    found = []
    for d in sorted((storage / name).glob("checkpoint_*")):
        cfg = d / "config.json"
        if cfg.exists() and (d / "model.safetensors").exists() and (d / "optimizer.pt").exists():
            found.append((json.loads(cfg.read_text())["position"]["step"], d))
    return sorted(found)


def _registered_checkpoint(run_dir: Path) -> bool:
    """Whether Ray Train's controller has recorded a checkpoint of the run (what a restart resumes from)."""
    try:
        snapshot = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or caught mid-write
        return False
    return bool(snapshot.get("latest_checkpoint_result"))


def test_two_worker_pretrain_checkpoints_and_resumes_after_kill(ray_local, pipeline_tables, tmp_path):
    storage = tmp_path / "runs"
    address = ray_local.get_runtime_context().gcs_address
    args = PRETRAIN + [
        "--tables", str(pipeline_tables), "--storage-path", str(storage), "--name", "r1",
        "--num-workers", "2", "--cpus-per-worker", "0.5", "--batch-size", "4", "--k", "2",
        "--max-steps", "6", "--checkpoint-every", "2", "--log-every", "1", "--warmup-steps", "2",
        "--adapter", "compressed", "--num-queries", "8", "--adapter-hidden", "64", "--adapter-heads", "4",
        "--random-bert", "hidden_size=64", "num_hidden_layers=1", "num_attention_heads=2", "intermediate_size=128",
        "--ray-address", address,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log1 = open(tmp_path / "run1.log", "w")
    first = subprocess.Popen(args, cwd=ROOT, stdout=log1, stderr=subprocess.STDOUT, env={**env, **RAY_OWN_POLL},
                             start_new_session=True)
    try:
        deadline = time.time() + 420
        while time.time() < deadline and not _checkpoints(storage, "r1") and first.poll() is None:
            time.sleep(1)
        assert _checkpoints(storage, "r1"), (tmp_path / "run1.log").read_text()[-4000:]
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # a hard kill: no clean shutdown, no final checkpoint
        first.wait()
        log1.close()
    killed_at = _checkpoints(storage, "r1")[-1][0]
    text1 = (tmp_path / "run1.log").read_text()
    assert killed_at >= 2
    # Losses per head and ITM accuracy are reported as it trains.
    row = json.loads(next(line[line.index("{"):] for line in text1.splitlines() if '"loss_itm"' in line and line.strip().endswith("}")))
    assert {"loss_itm", "loss_mlm", "loss_recovery", "itm_acc", "step", "lr"} <= set(row)

    second = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    text2 = second.stdout + second.stderr
    assert second.returncode == 0, text2[-4000:]
    resumed = [int(m) for m in re.findall(r"resumed from step (\d+)", text2)]
    assert resumed and min(resumed) >= killed_at and min(resumed) < 6, text2[-4000:]
    assert "resumed from step 0" not in text2
    final_step, final_dir = _checkpoints(storage, "r1")[-1]
    assert final_step == 6
    # The checkpoint inside is our format: it loads as an EDJE model.
    from edje.model.edje import load_checkpoint
    model = load_checkpoint(str(final_dir))
    assert model.config.adapter.num_queries == 8 and model.encoder.hidden_size == 64


# Short runs of the three training jobs on the same tables: one worker, two steps, a tiny random BERT.
TINY_RUN = ["--num-workers", "1", "--cpus-per-worker", "0.5", "--batch-size", "4", "--k", "2",
            "--max-steps", "2", "--checkpoint-every", "2", "--log-every", "1", "--warmup-steps", "1",
            "--adapter-hidden", "64", "--adapter-heads", "4",
            "--random-bert", "hidden_size=64", "num_hidden_layers=1", "num_attention_heads=2", "intermediate_size=128"]


def _train(job: str, tables: Path, root: Path, name: str, address: str, *extra: str):
    """Run jobs/<job> to the end; (exported checkpoint dir, the JSON metric rows it logged)."""
    export = root / f"{name}-export"
    args = [sys.executable, str(ROOT / "jobs" / job), "--tables", str(tables), "--storage-path", str(root / "runs"),
            "--name", name, "--export", str(export), "--ray-address", address, *TINY_RUN, *extra]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    rows = [json.loads(line[line.index("{"):]) for line in text.splitlines()
            if '"step"' in line and '"lr"' in line and line.strip().endswith("}")]
    rows = list({r["step"]: r for r in rows}.values())  # a worker's line may be echoed twice (stdout and Ray's log)
    assert [r["step"] for r in rows] == [1, 2], text[-4000:]
    return export, rows


def _max_abs_diff(a, b) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa if sa[k].numel())


@pytest.fixture(scope="module")
def local_run(ray_local, pipeline_tables, tmp_path_factory):
    """jobs/pretrain.py with --adapter local and --mining sample; its export is the teacher and init below."""
    address = ray_local.get_runtime_context().gcs_address
    return _train("pretrain.py", pipeline_tables, tmp_path_factory.mktemp("local"), "local", address,
                  "--adapter", "local", "--mining", "sample", "--mining-temperature", "0.1")


def test_pretrain_with_local_adapter_and_sampled_negatives(local_run, pipeline_tables):
    from edje.model.edje import load_checkpoint
    from edje.schemas.token_table import read_metadata
    export, rows = local_run
    meta = read_metadata(str(sorted(pipeline_tables.glob("*.parquet"))[0]))
    model = load_checkpoint(str(export))
    # The local adapter keeps every backbone token: the encoder reads all of them.
    assert model.config.adapter.kind == "local" and model.config.encoder.num_image_tokens == meta.num_tokens
    assert all(math.isfinite(r["loss_itm"]) and math.isfinite(r["loss_mlm"]) for r in rows)


def test_finetune_starts_from_the_init_checkpoint(local_run, pipeline_tables, tmp_path, ray_local):
    from edje.model.edje import load_checkpoint
    init, _ = local_run
    # The model flags match the init's shape, so a run that ignored --init would still train: from random
    # weights, and another seed than the init's own start (the same seed would rebuild it).
    export, rows = _train("finetune.py", pipeline_tables, tmp_path, "ft", ray_local.get_runtime_context().gcs_address,
                          "--init", str(init), "--adapter", "local", "--seed", "1")
    assert all("loss_itm" in r and "loss_mlm" not in r and "loss_recovery" not in r for r in rows)  # ITM only
    start, tuned = load_checkpoint(str(init)), load_checkpoint(str(export))
    # Two AdamW steps at lr <= 2e-5 move a weight by ~4e-5; a fresh init differs by ~1e-1.
    assert 0 < _max_abs_diff(start, tuned) < 1e-3


def test_distill_trains_a_compressed_student_on_the_teachers_scores(local_run, pipeline_tables, tmp_path, ray_local):
    from edje.model.edje import load_checkpoint, read_checkpoint_config
    teacher_dir, _ = local_run
    export, rows = _train("distill.py", pipeline_tables, tmp_path, "distill", ray_local.get_runtime_context().gcs_address,
                          "--teacher", str(teacher_dir), "--adapter", "compressed", "--num-queries", "8", "--seed", "1",
                          "--itm-first-stage-weight", "8")
    # The distillation loss is computed against the teacher's logits on every step.
    assert all("loss_distill" in r and "loss_itm" in r for r in rows), rows
    assert all(math.isfinite(r["loss_distill"]) and r["loss_distill"] > 0 for r in rows), rows
    # ITM on the fused score: the first stage's own accuracy on the mined pairs is logged beside the fused one.
    assert all(0 <= r["first_stage_acc"] <= 1 and 0 <= r["itm_fused_acc"] <= 1 for r in rows), rows
    assert read_checkpoint_config(str(export))["training"]["itm_first_stage_weight"] == 8.0
    student, teacher = load_checkpoint(str(export)), load_checkpoint(str(teacher_dir))
    assert student.config.adapter.kind == "compressed" and student.config.encoder.num_image_tokens == 8
    # The student's joint encoder starts from the teacher's: two steps at lr <= 3e-4 stay close to it.
    assert _max_abs_diff(student.encoder.bert, teacher.encoder.bert) < 5e-3


def test_training_tables_hold_the_backbones_text_embedding_of_each_caption(pipeline_tables):
    import numpy as np

    from edje.model.backbone import VisionBackbone
    from edje.schemas.config import BackboneConfig
    from edje.schemas.token_table import read_token_tables, vector_matrix
    table, meta = read_token_tables(sorted(str(p) for p in pipeline_tables.glob("*.parquet")))
    captions = table.column("caption").to_pylist()
    backbone = VisionBackbone.create(BackboneConfig(meta.backbone, meta.pretrained, meta.feature_layer))
    expected = backbone.encode_text(captions).numpy()
    stored = vector_matrix(table.column("text_embedding"))
    assert stored.shape == expected.shape == (len(captions), meta.embed_dim)
    np.testing.assert_allclose(stored, expected, atol=1e-5, rtol=0)  # stored as float32


def test_pretrain_with_the_binding_levers(pipeline_tables, tmp_path, ray_local):
    """Content-word MLM, noun swaps, attribute swaps, orientation flips, word context, caption rewrites and the 2-D
    adapter position reach the worker loop and the exported model (group MLM reaches it in the relation test below;
    the shapes world's captions have no side of orientation, so that loss is logged at 0)."""
    from edje.model.edje import load_checkpoint, read_checkpoint_config
    export, rows = _train("pretrain.py", pipeline_tables, tmp_path, "bind", ray_local.get_runtime_context().gcs_address,
                          "--adapter", "local", "--objectives", "itm", "mlm", "noun_swap", "attribute_swap", "orientation",
                          "--mlm-masking", "content",
                          "--word-context", "3", "--adapter-position", "2d", "--text-augment", "0.5")
    assert all(math.isfinite(r["loss_mlm"]) and 0 <= r["mlm_bind_acc"] <= 1 for r in rows), rows  # the read-out is logged
    assert all(math.isfinite(r["loss_noun_swap"]) and 0 <= r["noun_swap_acc"] <= 1 for r in rows), rows
    assert all(math.isfinite(r["loss_attribute_swap"]) and 0 <= r["attribute_swap_acc"] <= 1 for r in rows), rows
    assert all(r["loss_orientation"] == 0 for r in rows), rows
    model = load_checkpoint(str(export))
    assert model.encoder.word_context is not None and model.config.adapter.position == "2d"
    training = read_checkpoint_config(str(export))["training"]
    assert training["mlm_masking"] == "content" and training["text_augment"] == 0.5


def test_relation_parts_are_added_to_an_init_checkpoint_and_grounding_trains(local_run, pipeline_tables, tmp_path, ray_local):
    """--relation-roles / --route-layer / --ground-layer / --image-positions grow a trained checkpoint (its weights
    kept, the new parts from 0), the ground objective reads the world's grounding annotations, and the relation
    group's mask weight and the flip objective reach the worker."""
    from edje.model.edje import load_checkpoint, read_checkpoint_config
    init, _ = local_run
    world = pipeline_tables.parent.parent / "world"
    grounding = [str(world / f"flickr30k_{s}.json") for s in ("train", "val", "test")]
    export, rows = _train("pretrain.py", pipeline_tables, tmp_path, "rel", ray_local.get_runtime_context().gcs_address,
                          "--init", str(init), "--objectives", "itm", "mlm", "ground", "flip", "--grounding", *grounding,
                          "--relation-roles", "--route-layer", "1", "--ground-layer", "1", "--image-positions", "fixed",
                          "--mlm-masking", "groups", "--mlm-group-weight", "relation", "1000", "--seed", "1")
    # Grounded words were found in the batches (a run that matched none would log a loss of exactly 0).
    assert all(math.isfinite(r["loss_ground"]) and r["loss_ground"] > 0 for r in rows), rows
    assert all(math.isfinite(r["loss_flip"]) and 0 <= r["flip_acc"] <= 1 for r in rows), rows
    start, grown = load_checkpoint(str(init)), load_checkpoint(str(export))
    enc = grown.config.encoder
    assert (enc.relation_roles, enc.route_layer, enc.ground_layer, enc.image_positions) == (True, 1, 1, "fixed")
    assert read_checkpoint_config(str(export))["training"]["mlm_masking"] == "groups"
    # two steps from the init, not a fresh model; the fixed image rows of the position table were seeded with a
    # 2-D table (norm 2 a row), the one change on purpose
    pos = "bert.embeddings.position_embeddings.weight"
    sa, sb = start.encoder.bert.state_dict(), grown.encoder.bert.state_dict()
    assert max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa if k != pos and sa[k].numel()) < 5e-3
    assert float((sa[pos] - sb[pos]).abs().max()) > 0.1
    # the route moved off 0: with relation words masked (the group weight), MLM reads them at the one layer's output
    assert float(grown.encoder.route.weight.abs().max()) > 0


def test_a_worker_killed_mid_run_is_restarted_from_the_newest_checkpoint(pipeline_tables, tmp_path, ray_local):
    """--max-failures: the same run survives its worker process dying (a node lost, the OOM killer)."""
    storage = tmp_path / "runs"
    args = PRETRAIN + ["--tables", str(pipeline_tables), "--storage-path", str(storage), "--name", "survive",
                       "--ray-address", ray_local.get_runtime_context().gcs_address, "--adapter", "local",
                       "--max-failures", "2", *TINY_RUN]
    args[args.index("--max-steps") + 1] = "14"  # long enough that the kill lands mid-run
    args += ["--epochs", "100"]
    log_path = tmp_path / "survive.log"
    with open(log_path, "w") as log:
        run = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", **RAY_OWN_POLL})
        # A checkpoint folder on disk is not yet one the run restarts from: the controller registers it a moment
        # later (its snapshot file), and a kill in between restarts from scratch. Wait for the registration.
        deadline = time.time() + 420
        while time.time() < deadline and not _registered_checkpoint(storage / "survive") and run.poll() is None:
            time.sleep(0.5)
        assert _registered_checkpoint(storage / "survive"), log_path.read_text()[-4000:]
        worker = int(re.findall(r"RayTrainWorker pid=(\d+)", log_path.read_text())[-1])
        os.kill(worker, signal.SIGKILL)
        assert run.wait(timeout=600) == 0, log_path.read_text()[-4000:]
    text = log_path.read_text()
    resumed = [int(m) for m in re.findall(r"resumed from step (\d+)", text)]
    assert resumed and min(resumed) >= 2, text[-4000:]
    assert _checkpoints(storage, "survive")[-1][0] == 14


def test_flip_square_and_pointer_reach_the_worker(pipeline_tables, tmp_path, ray_local):
    """Tables encoded with --augment hflip train with their mirrored rows set apart as the flip square's images, the
    pointer trains with roles by the rule of English, and the checkpoint records both."""
    from edje.model.edje import load_checkpoint, read_checkpoint_config
    from edje.pipeline.job import run_encode_job
    from edje.schemas.encode_job import EncodeJobConfig
    from edje.schemas.shipped import DEFAULT_BACKBONE
    from edje.schemas.weights import find_weights

    world = pipeline_tables.parent.parent / "world"
    summary = run_encode_job(EncodeJobConfig(output=str(tmp_path / "mirror"), world_dir=str(world), world_images=48,
                                             batch_size=16, shard_size=24, augment="hflip",
                                             pretrained=find_weights(backbone=DEFAULT_BACKBONE)))
    assert summary["complete"] and summary["table_metadata"]["augment"] == "hflip"
    export, rows = _train("pretrain.py", tmp_path / "mirror" / "tables", tmp_path, "square",
                          ray_local.get_runtime_context().gcs_address,
                          "--adapter", "local", "--objectives", "itm", "flip", "pointer", "--flip-mode", "square",
                          "--relation-roles", "--role-parse", "english", "--route-layer", "1", "--pointer",
                          "--image-positions", "fixed")
    assert any("loss_flip_square" in r for r in rows), rows  # horizontal captions met their mirrored images
    assert all(math.isfinite(r["loss_flip"]) and math.isfinite(r["loss_pointer"]) for r in rows), rows
    enc = load_checkpoint(str(export)).config.encoder
    assert enc.pointer and enc.relation_roles and enc.role_vocabulary is None
    training = read_checkpoint_config(str(export))["training"]
    assert training["flip_mode"] == "square" and "pointer" in training["objectives"]
    # Its compressed student, on a query grid so that it keeps the teacher's pointer over its own coarse cells,
    # regresses the teacher's route inputs, how they change on the mirrored image, and its cells (rebuilt from the
    # compressed tokens), in the same worker loop.
    student, student_rows = _train("pretrain.py", tmp_path / "mirror" / "tables", tmp_path, "student",
                                   ray_local.get_runtime_context().gcs_address,
                                   "--init-encoder-from", str(export), "--teacher", str(export), "--adapter",
                                   "compressed", "--num-queries", "16", "--adapter-query-grid", "0.5",
                                   "--adapter-position-out", "1.0", "--adapter-recover-cells", "64", "--objectives",
                                   "itm", "flip", "distill", "route_distill", "route_mirror", "cell_recovery", "pointer",
                                   "--flip-mode", "square", "--relation-roles", "--role-parse", "english",
                                   "--route-layer", "1", "--image-positions", "fixed", "--pointer")
    terms = ("loss_route_distill", "loss_route_mirror", "loss_distill", "loss_cell_recovery", "loss_pointer")
    assert all(math.isfinite(r[t]) for r in student_rows for t in terms), student_rows
    assert any(r["loss_route_distill"] > 0 for r in student_rows), student_rows
    assert any(r["loss_route_mirror"] > 0 for r in student_rows), student_rows
    shipped = load_checkpoint(str(student))
    assert shipped.adapter.position_out is not None  # its tokens carry where its queries look
    assert shipped.config.adapter.query_grid == 0.5 and shipped.config.encoder.pointer
