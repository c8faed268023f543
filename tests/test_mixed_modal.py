"""benchmarks/mixed_modal.py's twin queries on a tiny generated world: a member's image + a sibling's caption -> the sibling."""

import numpy as np
from mixed_modal import twin_queries

from edje.evaluation.rerank_eval import world_families
from edje.sampleworld.world import WorldConfig, generate
from edje.schemas.annotations import load_annotations


def test_twin_queries_pair_every_member_with_each_sibling_caption(tmp_path):
    world = generate(WorldConfig(seed=3, n_train=0, n_val=0, n_test=12, image_size=32, family_size=4), tmp_path)
    ann = load_annotations(world.annotations["test"])
    families, _ = world_families(ann)
    records = world.by_id()
    for caption in (0, 2):
        queries = twin_queries(ann, families, caption)
        assert len(queries) == 3 * 4 * 3  # 3 families, 4 members, 3 siblings each
        assert len({(q.image, q.target) for q in queries}) == len(queries)
        for q in queries:
            assert q.image != q.target and families[q.image] == families[q.target]
            assert q.text == records[ann.image_ids[q.target]].captions[caption]  # the sibling's caption, as asked
            assert q.text not in records[ann.image_ids[q.image]].captions  # a twin's caption, not the image's own
    # Every image is a query image 3 times and an answer 3 times.
    assert np.bincount([q.image for q in queries]).tolist() == [3] * 12
    assert np.bincount([q.target for q in queries]).tolist() == [3] * 12
