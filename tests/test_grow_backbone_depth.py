"""A tower grown deeper from a trained one computes what the trained one did, and every block of it trains."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from edje.model.backbone_registry import open_clip_registry
from edje.research.grow_backbone_depth import grow, grown_state


@pytest.mark.parametrize("shallow, deeper, depth", [("edje-tiny-convvit-128", "edje-tiny-convvit-128-d8", 8),
                                                     ("edje-tiny-convvit-128-d8", "edje-tiny-convvit-128-d16", 16)])
def test_grown_tower_gives_the_trained_towers_tokens_and_embeddings(tmp_path, shallow, deeper, depth):
    open_clip = open_clip_registry()
    torch.manual_seed(0)
    small = open_clip.create_model(shallow).eval()
    src = tmp_path / "small.safetensors"
    save_file({k: v.contiguous() for k, v in small.state_dict().items()}, str(src), metadata={"model": shallow})
    grow(str(src), str(tmp_path / "deep.safetensors"), deeper)
    deep = open_clip.create_model(deeper).eval()
    deep.load_state_dict(load_file(str(tmp_path / "deep.safetensors")))
    x = torch.randn(2, 3, 128, 128)
    with torch.no_grad():
        assert torch.equal(small.visual.trunk.forward_features(x), deep.visual.trunk.forward_features(x))
        assert torch.equal(small.encode_image(x), deep.encode_image(x))
    assert len(deep.visual.trunk.blocks) == depth
    # The new blocks' branches start at zero output, not dead: a step moves their projections.
    deep.train()
    deep.encode_image(x).pow(2).sum().backward()
    assert deep.visual.trunk.blocks[1].attn.proj.weight.grad.abs().sum() > 0
    assert deep.visual.trunk.blocks[depth - 1].mlp.fc2.weight.grad.abs().sum() > 0


def test_a_depth_that_does_not_interleave_is_refused():
    open_clip = open_clip_registry()
    deep = open_clip.create_model("edje-tiny-convvit-128-d8").state_dict()
    with pytest.raises(ValueError, match="8 blocks cannot interleave one of 3"):
        grown_state({k: v for k, v in deep.items() if not k.startswith("visual.trunk.blocks.") or
                     int(k.split(".")[3]) < 3}, deep)
