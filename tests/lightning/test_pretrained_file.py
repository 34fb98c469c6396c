"""``VisionClassifier(pretrained_file=...)``: timm backbones from a local weights file saved in the
test (never downloaded): the same tensors, the classifier dropped, input channels adapted."""

from __future__ import annotations

import pytest
import torch

import losses

timm = pytest.importorskip("timm")

from lightning_modules.models import VisionClassifier  # noqa: E402
from lightning_modules.models.pretrained import load_pretrained_file  # noqa: E402


def _source(in_chans=3, seed=0):
    torch.manual_seed(seed)
    return timm.create_model("resnet10t", pretrained=False, in_chans=in_chans, num_classes=7)


@pytest.mark.parametrize("fmt", ["pt", "safetensors", "lightning"])
def test_backbone_equals_the_saved_weights(tmp_path, fmt):
    src = _source(in_chans=1)
    state = src.state_dict()
    path = tmp_path / f"w.{'safetensors' if fmt == 'safetensors' else 'pt'}"
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    elif fmt == "lightning":  # a VisionClassifier checkpoint's state dict, under "state_dict"
        torch.save({"state_dict": {f"net.backbone.{k}": v for k, v in state.items()}}, path)
    else:
        torch.save(state, path)
    torch.manual_seed(123)  # a different random init for the new model
    model = VisionClassifier(losses.CrossEntropyLoss(), num_classes=5, in_chans=1, pretrained_file=str(path))
    got = model.net.backbone.state_dict()
    for k, v in got.items():
        assert torch.equal(v, state[k]), k
    assert not any(k.startswith("fc.") for k in got)
    fresh = VisionClassifier(losses.CrossEntropyLoss(), num_classes=5, in_chans=1)
    assert not torch.equal(fresh.net.backbone.conv1[0].weight, state["conv1.0.weight"])
    assert model.hparams["pretrained_file"] == str(path)


def test_rgb_weights_adapted_to_one_channel(tmp_path):
    src = _source(in_chans=3)
    torch.save(src.state_dict(), tmp_path / "rgb.pt")
    backbone = timm.create_model("resnet10t", pretrained=False, in_chans=1, num_classes=0)
    load_pretrained_file(backbone, str(tmp_path / "rgb.pt"))
    w = src.state_dict()["conv1.0.weight"]
    assert torch.allclose(backbone.conv1[0].weight, w.sum(dim=1, keepdim=True))
    assert torch.equal(backbone.layer1[0].conv1.weight, src.layer1[0].conv1.weight)


def test_wrong_file_errors(tmp_path):
    torch.save(timm.create_model("resnet18", pretrained=False, num_classes=0).state_dict(), tmp_path / "r18.pt")
    backbone = timm.create_model("resnet10t", pretrained=False, in_chans=3, num_classes=0)
    with pytest.raises(ValueError, match=r"^load_pretrained_file: .* does not fit the backbone"):
        load_pretrained_file(backbone, str(tmp_path / "r18.pt"))
    with pytest.raises(ValueError, match=r"^load_pretrained_file: no weights file"):
        load_pretrained_file(backbone, str(tmp_path / "missing.pt"))


def test_segmenter_feature_levels_from_a_full_backbone_file(tmp_path):
    from lightning_modules.models import VisionSegmenter

    src = _source(in_chans=1, seed=3)
    torch.save(src.state_dict(), tmp_path / "full.pt")
    seg = VisionSegmenter(losses.SoftDiceLoss(), num_classes=11, in_chans=1, pretrained_file=str(tmp_path / "full.pt"))
    own = seg.backbone.state_dict()
    assert own and all(torch.equal(v, src.state_dict()[k]) for k, v in own.items())
    # a truncated backbone still needs every key it has
    other = timm.create_model("resnet18", pretrained=False, in_chans=1, num_classes=0)
    torch.save(other.state_dict(), tmp_path / "r18.pt")
    with pytest.raises(ValueError, match=r"^load_pretrained_file: .* does not fit the backbone"):
        VisionSegmenter(losses.SoftDiceLoss(), num_classes=11, in_chans=1, pretrained_file=str(tmp_path / "r18.pt"))
