"""A corpus in three shards on a three-node Ray cluster answers as the one-shard server does; a shard with two
replicas keeps answering when one of them is killed.

Real parts: ray.cluster_utils.Cluster (three raylets), Ray Serve with one FirstStage and one Reranker deployment
per shard, HTTP on loopback. Checked: each shard's store holds about a third of the token bytes (read from the
replicas), 8 searches give the same ids and scores as one shard, a live add lands on the shard its id hashes
to and is still served after the application is deployed again. With `replicas_per_shard=2` (a local Ray), a
Reranker and a FirstStage replica of one shard are killed under load and no request fails. In-process: a sharded
text search embeds its query once, and the miner rescores each pair on the shard that owns its image.
"""
import base64
import io
import os
import threading
import time

import numpy as np
import pytest
import requests

from edje.serving.shards import merge_hits
from edje.serving.startup import StartupConfig
from edje.storage.shards import filter_shard, shard_of

# The project's Serve proxy health checks (serving.startup): a local Ray started here inherits them.
os.environ.update(StartupConfig().env())


def test_shard_of_is_stable_and_spreads_ids():
    ids = [f"img-{i}" for i in range(3000)]
    got = [shard_of(x, 3) for x in ids]
    # pinned values: the assignment decides where live images are logged, so a change must be deliberate
    names = ("a", "img-0", "live-0123456789abcdef", "b", "c", "d")
    assert [shard_of(x, 3) for x in names] == [2, 2, 0, 2, 0, 2]
    assert [shard_of(x, 7) for x in names] == [4, 6, 0, 0, 2, 4]
    assert shard_of("img-0", 1) == 0 and all(0 <= s < 3 for s in got)
    counts = np.bincount(got, minlength=3)
    assert counts.min() > 900, counts  # about a third each


def test_shard_of_does_not_depend_on_the_process():
    import subprocess
    import sys

    code = "from edje.storage.shards import shard_of; print([shard_of(f'x{i}', 5) for i in range(20)])"
    root = str(__import__("pathlib").Path(__file__).resolve().parent.parent)
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                           env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}).stdout for seed in ("1", "2")}
    assert len(runs) == 1 and runs.pop().startswith("[")


def test_filter_and_merge():
    import pyarrow as pa

    table = pa.table({"image_id": [f"i{k}" for k in range(30)], "v": list(range(30))})
    parts = [filter_shard(table, s, 3) for s in range(3)]
    assert sorted(sum((p.column("image_id").to_pylist() for p in parts), [])) == sorted(table.column("image_id").to_pylist())
    assert filter_shard(table, 0, 1) is table
    assert merge_hits([[("a", 0.9), ("b", 0.5)], [("c", 0.7)], []], 2) == [("a", 0.9), ("c", 0.7)]


@pytest.mark.slow
def test_three_shards_on_three_nodes_answer_as_one_shard(tmp_path):
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster
    from world_serving import CHECKPOINT, encode_world, serving

    from edje.serving.app import build
    from edje.serving.config import DeploymentResources, ServeConfig

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3})
    for _ in range(2):
        cluster.add_node(num_cpus=3)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        world = encode_world(tmp_path, seed=404, n_test=150, base_url="http://127.0.0.1:9")
        small = DeploymentResources(num_cpus=0.5)
        common = dict(checkpoint=CHECKPOINT, token_tables=(world.table,), auth_token_env=None, torch_threads=1,
                      reranker=DeploymentResources(num_cpus=0.5, max_ongoing_requests=64), first_stage=small, ingress=small)
        one = ServeConfig(**common, live_dir=str(tmp_path / "live-one"))
        three = ServeConfig(**common, shards=3, live_dir=str(tmp_path / "live-three"))
        with serving(("one", "/one", one), ("three", "/three", three)) as (base, _):
            assert requests.get(f"{base}/three/readyz", timeout=60).json()["deployments"].keys() >= {
                "Reranker-0", "Reranker-1", "Reranker-2", "FirstStage-0", "FirstStage-1", "FirstStage-2"}

            # Each shard's replica holds its own rows only: about a third of the token bytes, as its store reports.
            info = requests.get(f"{base}/three/v1/info", timeout=60).json()
            per_shard = info["token_store"]
            whole = requests.get(f"{base}/one/v1/info", timeout=60).json()["token_store"]
            assert per_shard["images"] == whole["images"] == len(world.image_ids) and per_shard["memory_bytes"] == whole["memory_bytes"]
            shares = [s["memory_bytes"] / whole["memory_bytes"] for s in info["shards"]]
            assert all(0.2 < x < 0.47 for x in shares), shares
            expected = np.bincount([shard_of(i, 3) for i in world.image_ids], minlength=3).tolist()
            assert [s["images"] for s in info["shards"]] == expected

            # 8 searches: the same ids in the same order and the same scores as the one-shard server.
            for q in world.captions[:8]:
                a = requests.post(f"{base}/one/v1/search", json={"query": q, "top_k": 10}, timeout=120).json()["results"]
                b = requests.post(f"{base}/three/v1/search", json={"query": q, "top_k": 10}, timeout=120).json()["results"]
                assert [r["image_id"] for r in a] == [r["image_id"] for r in b], q
                assert np.allclose([r["relevance_score"] for r in a], [r["relevance_score"] for r in b], atol=1e-4)
            # Rerank over ids that live on every shard, and an image query whose vector comes from its owner shard.
            docs = world.image_ids[:12]
            ra = requests.post(f"{base}/one/v1/rerank", json={"query": world.captions[3], "documents": docs}, timeout=120).json()
            rb = requests.post(f"{base}/three/v1/rerank", json={"query": world.captions[3], "documents": docs}, timeout=120).json()
            assert [(r["index"], round(r["relevance_score"], 4)) for r in ra["results"]] == \
                   [(r["index"], round(r["relevance_score"], 4)) for r in rb["results"]]
            qa = requests.post(f"{base}/one/v1/search", json={"image": docs[5], "top_k": 8}, timeout=120).json()["results"]
            qb = requests.post(f"{base}/three/v1/search", json={"image": docs[5], "top_k": 8}, timeout=120).json()["results"]
            assert [r["image_id"] for r in qa] == [r["image_id"] for r in qb]
            assert requests.post(f"{base}/three/v1/rerank", json={"query": "x", "documents": ["nope"]}, timeout=60).status_code == 404

            # A live add lands on the shard its id hashes to, and is served again after a redeploy.
            from PIL import Image

            buf = io.BytesIO()
            Image.open(world.images / f"{world.image_ids[0]}.jpg").transpose(Image.FLIP_LEFT_RIGHT).save(buf, "JPEG")
            image = base64.b64encode(buf.getvalue()).decode()
            added = requests.post(f"{base}/three/v1/images", json={"image": image, "id": "added-1"}, timeout=120)
            assert added.status_code == 200, added.text
            owner = shard_of("added-1", 3)
            assert (tmp_path / "live-three" / f"shard-{owner:03d}" / "LOG").exists()
            rows = lambda: [s["images"] for s in requests.get(f"{base}/three/v1/info", timeout=60).json()["shards"]]
            assert rows() == [n + (s == owner) for s, n in enumerate(expected)]
            serve.delete("three")
            serve.run(build(three), name="three", route_prefix="/three")
            r = requests.post(f"{base}/three/v1/rerank", json={"query": world.captions[0], "documents": ["added-1", docs[1]]},
                              timeout=120)
            assert r.status_code == 200, r.text
            assert rows() == [n + (s == owner) for s, n in enumerate(expected)]
            hits = requests.post(f"{base}/three/v1/search", json={"image": "added-1", "top_k": 3}, timeout=120)
            assert hits.status_code == 200 and hits.json()["results"], hits.text
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_serve_flags_choose_shards_and_index(tmp_path):
    from edje.jobs.serve import config_from_args, parse

    (tmp_path / "t.parquet").write_bytes(b"")
    cfg = config_from_args(parse(["--checkpoint", "c", "--tokens", str(tmp_path / "t.parquet"), "--shards", "3",
                                  "--index-factory", "IVF64,PQ8", "--index-search-params", "nprobe=8",
                                  "--live-dir", str(tmp_path / "live")]))
    assert (cfg.shards, cfg.index_factory, cfg.index_search_params) == (3, "IVF64,PQ8", "nprobe=8")
    two = cfg.for_shard(2)
    assert two.shard == 2 and two.live_dir == str(tmp_path / "live" / "shard-002")
    assert cfg.live_dir_of("img-0") == str(tmp_path / "live" / f"shard-{shard_of('img-0', 3):03d}")
    assert config_from_args(parse(["--checkpoint", "c", "--tokens", str(tmp_path / "t.parquet"),
                                   "--live-dir", "x"])).for_shard(0).live_dir == "x"  # one shard: the folder as given
    with pytest.raises(ValueError, match="shards"):
        cfg.replace(shard=3)


def test_replicas_per_shard_and_admission_reach_the_deployment_options(tmp_path):
    from edje.jobs.serve import config_from_args, parse
    from edje.serving.config import DeploymentResources

    (tmp_path / "t.parquet").write_bytes(b"")
    flags = ["--checkpoint", "c", "--tokens", str(tmp_path / "t.parquet"), "--shards", "2"]
    cfg = config_from_args(parse(flags + ["--replicas-per-shard", "3", "--ingress-max-ongoing", "8",
                                          "--ingress-max-queued", "4", "--retry-after", "2"]))
    assert (cfg.replicas_per_shard, cfg.retry_after_s) == (3, 2.0)
    assert cfg.first_stage.options(cfg.replicas_per_shard)["num_replicas"] == 3
    assert cfg.reranker.options(cfg.replicas_per_shard)["num_replicas"] == 3
    ingress = cfg.ingress.options()
    assert (ingress["max_ongoing_requests"], ingress["max_queued_requests"]) == (8, 4) and "num_replicas" not in ingress
    # Every deployment drains in short loops (Serve's 2 s would hold each stopping replica that long for nothing).
    assert {cfg.first_stage.options()["graceful_shutdown_wait_loop_s"], ingress["graceful_shutdown_wait_loop_s"]} == {0.5}
    with pytest.raises(ValueError, match="graceful_shutdown_wait_loop_s"):
        DeploymentResources(graceful_shutdown_wait_loop_s=0)
    # A deployment's own replica count wins; one replica per shard leaves the count to Serve (or a config file).
    assert config_from_args(parse(flags + ["--replicas-per-shard", "2", "--reranker-replicas", "5"])).reranker.options(2)[
        "num_replicas"] == 5
    assert "num_replicas" not in config_from_args(parse(flags)).reranker.options(1)
    default = config_from_args(parse(flags)).ingress.options()
    assert (default["max_ongoing_requests"], default["max_queued_requests"]) == (64, 64)
    with pytest.raises(ValueError, match="replicas_per_shard"):
        cfg.replace(replicas_per_shard=0)
    with pytest.raises(ValueError, match="max_queued_requests"):
        DeploymentResources(max_queued_requests=0)  # Serve would refuse every request
    gated = config_from_args(parse(flags + ["--ingress-max-ongoing", "8", "--admit-in-flight", "2"]))
    assert gated.admit_in_flight == 2 and config_from_args(parse(flags)).admit_in_flight is None
    for admit in ("0", "8"):  # the gate needs a slot, and Serve must hand it more than it admits
        with pytest.raises(ValueError, match="admit_in_flight"):
            config_from_args(parse(flags + ["--ingress-max-ongoing", "8", "--admit-in-flight", admit]))


# ------------------------------------------------------------------------------------------ in-process fan-out
class _Handle:
    """A deployment stand-in over a plain core (FirstStage, RerankerCore): `h.method.remote(*args)` calls the core's
    method in-process and records its name."""

    def __init__(self, core):
        self.core, self.calls = core, []

    def __getattr__(self, name):
        method, calls = getattr(self.core, name), self.calls

        class _Method:
            async def remote(self, *args):
                calls.append(name)
                return method(*args)

        return _Method()


class _Scorer:
    """The Reranker deployment's score_pairs over a RerankerCore, without Serve (prepare, one forward, finish)."""

    def __init__(self, core):
        self.core = core

    def score_pairs(self, texts, image_ids, with_urls=False, text_embeddings=None, images=None):
        prepared = self.core.prepare(texts, image_ids, with_urls, images)
        if not hasattr(prepared, "chunks"):  # a Scores naming unknown ids
            return prepared
        logits = np.concatenate(self.core.forward(prepared.chunks))
        return self.core.finish(prepared, logits, len(texts), text_embeddings)


@pytest.fixture(scope="module")
def random_corpus(tmp_path_factory, tiny_edje_config):
    from edje.serving.random_corpus import write_random_corpus

    return write_random_corpus(str(tmp_path_factory.mktemp("shards")), tiny_edje_config, num_images=40)


def test_a_sharded_text_search_embeds_its_query_once_and_answers_as_one_shard(random_corpus):
    import asyncio

    from edje.serving.first_stage import FirstStage
    from edje.serving.shards import ShardedCorpus, call_with_retry

    tables = random_corpus.compressed_tables
    whole = FirstStage(tables)
    handles = [_Handle(FirstStage(tables, shard=s, num_shards=2)) for s in range(2)]
    corpus = ShardedCorpus([object(), object()], handles)
    for n, query in enumerate(random_corpus.captions[:4]):
        found = asyncio.run(corpus.search_text(call_with_retry, query, 10))
        expected = whole.search_text(query, 10)
        assert [h[0] for h in found.hits] == [h[0] for h in expected.hits], query
        np.testing.assert_allclose([h[1] for h in found.hits], [h[1] for h in expected.hits], atol=1e-5)
        np.testing.assert_allclose(found.query_embedding, expected.query_embedding, atol=1e-6)
        calls = [c for h in handles for c in h.calls]
        # One shard embedded the text and searched its rows; the other searched with that vector.
        assert calls.count("search_text") == n + 1 and calls.count("search_vector") == n + 1, calls
    assert [h.calls.count("search_text") for h in handles] == [2, 2]  # the shards take turns embedding


def test_the_miner_rescores_each_pair_on_the_shard_that_owns_its_image(random_corpus):
    import asyncio

    from edje.serving.config import DeploymentResources, ServeConfig
    from edje.serving.miner import Miner
    from edje.serving.reranker_core import RerankerCore
    from edje.serving.shards import ShardedRerankers

    c = random_corpus
    cfg = ServeConfig(checkpoint=c.checkpoint, token_tables=tuple(c.compressed_tables), auth_token_env=None,
                      reranker=DeploymentResources(num_cpus=1))
    whole = _Handle(_Scorer(RerankerCore(cfg)))
    shards = [_Handle(_Scorer(RerankerCore(cfg.replace(shards=2).for_shard(s)))) for s in range(2)]
    assert all(0 < len(h.core.core.store) < 40 for h in shards)  # each shard holds only its rows

    def mine(reranker):
        miner = Miner(c.compressed_tables, (c.raw_table,), reranker=reranker)
        return asyncio.run(miner.negatives(c.image_ids[:3], c.captions[:3], k=3, rescore=True, pool=8))

    got, expected = mine(ShardedRerankers(shards)), mine(whole)
    assert "negatives" in got, got  # every candidate was found: each went to the shard that holds it
    for a, b in zip(got["negatives"], expected["negatives"]):
        assert [n["image_id"] for n in a["negative_images"]] == [n["image_id"] for n in b["negative_images"]]
        np.testing.assert_allclose([n["itm_logit"] for n in a["negative_images"]],
                                   [n["itm_logit"] for n in b["negative_images"]], atol=1e-4)
        assert [n["caption"] for n in a["negative_captions"]] == [n["caption"] for n in b["negative_captions"]]
    assert [h.calls for h in shards] == [["score_pairs"], ["score_pairs"]]  # one call per shard for the whole batch


def test_a_switched_rule_reads_the_whole_requests_best_cosine_across_shards(random_corpus, tmp_path):
    """The ingress fuses a request's pairs after the shards have scored them, so a rule that reads the query's best
    candidate's cosine sees the whole request's: the shard that holds none of the near candidates fuses like the
    other. The ingress is the class Serve deploys, over two real shard cores, without Serve."""
    import shutil

    from fastapi.testclient import TestClient

    from edje.model.edje import read_checkpoint_config
    from edje.model.ranking import RankingConfig, write_ranking
    from edje.serving.config import DeploymentResources, ServeConfig
    from edje.serving.first_stage import FirstStage
    from edje.serving.ingress import Ingress, build_api
    from edje.serving.reranker_core import RerankerCore
    from edje.serving.shards import ShardedCorpus

    c = random_corpus
    cfg = ServeConfig(checkpoint=c.checkpoint, token_tables=tuple(c.compressed_tables), auth_token_env=None,
                      reranker=DeploymentResources(num_cpus=1))
    query, docs = c.captions[0], c.image_ids[:16]
    emb = FirstStage(c.compressed_tables).embed([query])
    whole = _Scorer(RerankerCore(cfg)).score_pairs([query] * len(docs), docs, False, np.repeat(emb, len(docs), axis=0))
    itm, cos = whole.logits, whole.cosines
    owner = np.array([shard_of(d, 2) for d in docs])
    best = [float(cos[owner == s].max()) for s in range(2)]
    assert best[0] != best[1]
    rule = RankingConfig(8.0, low_confidence_weight=0.0, confidence_threshold=float(np.mean(best)))
    checkpoint = str(tmp_path / "switched")
    shutil.copytree(c.checkpoint, checkpoint)
    write_ranking(checkpoint, rule)

    ing = object.__new__(Ingress.func_or_class)
    ing.config = cfg.replace(checkpoint=checkpoint, shards=2)
    ing.auth_token, ing.ranking, ing.miner, ing.text_limit = None, rule, None, None
    ing.checkpoint_meta = read_checkpoint_config(checkpoint)
    ing.corpus = ShardedCorpus([_Handle(_Scorer(RerankerCore(ing.config.for_shard(s)))) for s in range(2)],
                               [_Handle(FirstStage(c.compressed_tables, shard=s, num_shards=2)) for s in range(2)])
    client = TestClient(build_api(ing))

    def served(ids):
        body = client.post("/v1/rerank", json={"query": query, "documents": ids, "raw_scores": True})
        assert body.status_code == 200, body.text
        out = np.zeros(len(ids))
        for r in body.json()["results"]:
            out[r["index"]] = r["relevance_score"]
        return out

    # Across both shards the best cosine clears the threshold: every pair adds 8 x its cosine, the far shard's too.
    np.testing.assert_allclose(served(docs), itm + 8.0 * cos, atol=1e-4)
    # The far shard's candidates alone: the query's best is below it, and the ITM logit ranks alone.
    far = int(np.argmin(best))
    mine = owner == far
    np.testing.assert_allclose(served([d for d, m in zip(docs, mine) if m]), itm[mine], atol=1e-4)


# ------------------------------------------------------------------------------------------ replicas per shard
def _replica_actors(app: str, deployment: str):
    """Names of the live replica actors of one deployment (Serve names them SERVE_REPLICA::<app>#<deployment>#<id>)."""
    import ray

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))


@pytest.mark.slow
def test_a_shard_keeps_answering_when_one_of_its_replicas_is_killed(ray_local, tmp_path):
    import ray
    from world_serving import CHECKPOINT, encode_world, serving

    from edje.serving.config import DeploymentResources, ServeConfig

    world = encode_world(tmp_path, seed=515, n_test=60, base_url="http://127.0.0.1:9")
    cfg = ServeConfig(checkpoint=CHECKPOINT, token_tables=(world.table,), caption_sources=(world.annotations,),
                      auth_token_env=None, torch_threads=1, shards=2, replicas_per_shard=2,
                      reranker=DeploymentResources(num_cpus=0.1, max_ongoing_requests=64),
                      first_stage=DeploymentResources(num_cpus=0.1), ingress=DeploymentResources(num_cpus=0.1),
                      miner=DeploymentResources(num_cpus=0.1))
    with serving(("edje", "/", cfg)) as (base, _):
        for dep in ("Reranker-0", "Reranker-1", "FirstStage-0", "FirstStage-1"):
            assert len(_replica_actors("edje", dep)) == 2, dep  # replicas_per_shard replicas of each
        victim_shard = shard_of(world.image_ids[0], 2)
        own = [i for i in world.image_ids if shard_of(i, 2) == victim_shard]
        caption = world.captions[world.image_ids.index(own[0])]
        search = {"query": caption, "top_k": 10}
        rerank = {"query": caption, "documents": own[:8], "raw_scores": True}
        before = requests.post(f"{base}/v1/rerank", json=rerank, timeout=120).json()["results"]
        found = requests.post(f"{base}/v1/search", json=search, timeout=120).json()["results"]
        assert any(shard_of(r["image_id"], 2) == victim_shard for r in found)  # the shard's images are searched

        statuses, stop = [], threading.Event()

        def load(route, body):
            with requests.Session() as http:
                while not stop.is_set():
                    try:
                        statuses.append((route, http.post(base + route, json=body, timeout=60).status_code))
                    except requests.RequestException as e:
                        statuses.append((route, type(e).__name__))

        threads = [threading.Thread(target=load, args=args) for args in
                   (("/v1/search", search), ("/v1/rerank", rerank), ("/v1/search", search), ("/v1/rerank", rerank))]
        for t in threads:
            t.start()
        time.sleep(2.0)
        killed = [_replica_actors("edje", f"{kind}-{victim_shard}")[0] for kind in ("Reranker", "FirstStage")]
        for name in killed:
            ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
        at = len(statuses)
        time.sleep(10.0)
        stop.set()
        for t in threads:
            t.join(120)
        after_kill = statuses[at:]
        assert len(after_kill) >= 8 and {r for r, _ in after_kill} == {"/v1/search", "/v1/rerank"}, statuses
        assert all(code == 200 for _, code in statuses), sorted(set(statuses))  # the other replica answered every one

        # The shard's images are still scored the same, and searched.
        again = requests.post(f"{base}/v1/rerank", json=rerank, timeout=120).json()["results"]
        assert [(r["index"], round(r["relevance_score"], 4)) for r in again] == \
               [(r["index"], round(r["relevance_score"], 4)) for r in before]
        hits = requests.post(f"{base}/v1/search", json=search, timeout=120).json()["results"]
        assert [r["image_id"] for r in hits] == [r["image_id"] for r in found]

        # The miner rescores through both shards' rerankers (each pair where its image lives).
        pairs = [{"image_id": i, "caption": world.captions[n]} for n, i in enumerate(world.image_ids[:4])]
        r = requests.post(f"{base}/v1/negatives", json={"pairs": pairs, "k": 3, "rescore": True, "pool": 12}, timeout=120)
        assert r.status_code == 200 and r.json()["rescored"], r.text
        negatives = [n for row in r.json()["negatives"] for n in row["negative_images"]]
        assert all(n["itm_logit"] is not None for n in negatives)
        assert {shard_of(n["image_id"], 2) for n in negatives} == {0, 1}


def test_prebuild_writes_each_shards_cache_and_index_ahead_of_serving(random_corpus, tmp_path):
    """`python -m edje.storage.prebuild` as the docs run it: one line per shard, the shards' rows make the corpus,
    and each shard's index is built over its own rows; a second run finds everything built."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "edje.storage.prebuild", *random_corpus.compressed_tables, "--shards", "2",
           "--cache-dir", str(tmp_path / "cache"), "--index-factory", "IVF4,Flat"]
    runs = []
    for _ in range(2):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append([json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")])
    first, again = runs
    assert [r["shard"] for r in first] == [0, 1]
    assert sum(r["rows"] for r in first) == len(random_corpus.image_ids) and all(r["rows"] for r in first)
    assert all(r["index"] for r in first)
    assert [(r["folder"], r["rows"]) for r in again] == [(r["folder"], r["rows"]) for r in first]
