"""What a LiT or distillation run with one unlocked MiniLM layer must leave: the image tower as it came, the packaged
MiniLM's lower layers bit for bit (stored fp16), its top layer trained."""
from __future__ import annotations

import torch
from safetensors.torch import load_file


def assert_image_tower_kept_and_top_layer_alone_trained(start: str, trained: str, minilm_path: str) -> None:
    """``trained`` (a backbone file) has ``start``'s image tower bit for bit, MiniLM's layers below the top one as
    packaged, and a top layer that moved."""
    from transformers import AutoModel

    a, b = load_file(start), load_file(trained)
    visual = [k for k in a if k.startswith("visual.")]
    assert len(visual) > 20 and all(torch.equal(a[k], b[k]) for k in visual)
    pretrained = {f"text.transformer.{k}": v.half() for k, v in AutoModel.from_pretrained(minilm_path).state_dict().items()}
    lower = [k for k in b if k in pretrained and ".layer.5." not in k]
    top = [k for k in b if ".layer.5." in k]
    assert len(lower) > 60 and all(torch.equal(b[k], pretrained[k]) for k in lower)
    assert top and not all(torch.equal(b[k], pretrained[k]) for k in top)
