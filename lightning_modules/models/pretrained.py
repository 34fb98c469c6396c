"""Backbone weights from a local file (``pretrained_file`` of the vision models); never downloads."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["load_pretrained_file"]


def load_pretrained_file(backbone: nn.Module, path: str, *, allow_unexpected: bool = False) -> None:
    """Load a local weights file into a timm backbone built with ``num_classes=0``; never downloads.

    ``path``: a ``.safetensors`` file or a ``torch.save`` file (read with ``weights_only=True``)
    holding a state dict, optionally under ``"state_dict"`` / ``"model"``, optionally with a
    ``module.`` prefix (DDP) or the ``net.backbone.`` prefix of a ``VisionClassifier``
    checkpoint. The timm classifier's keys (``pretrained_cfg["classifier"]``) are dropped; when
    the first convolution's input channels differ from the backbone's (ImageNet RGB weights for
    1-channel images) it is adapted with timm's ``adapt_input_conv``. Every other key must match
    exactly, else ``ValueError`` names the missing and unexpected keys. ``allow_unexpected``: keys
    the backbone lacks are skipped (a ``features_only`` backbone truncated after its last feature
    level); every key the backbone has must still be in the file.
    """
    fn = "load_pretrained_file"
    if not os.path.isfile(str(path)):
        raise ValueError(f"{fn}: no weights file at {path!r} (got a missing path); pass a local .safetensors or "
                         ".pt/.pth file (nothing is downloaded)")
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        state: Any = load_file(str(path), device="cpu")
    else:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"{fn}: {path!r} holds no state dict of tensors (got {type(state).__name__}); save "
                         "model.state_dict()")
    for prefix in ("net.backbone.", "module."):
        if any(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    cfg = getattr(backbone, "pretrained_cfg", None) or {}
    classifiers = cfg.get("classifier") or ()
    classifiers = (classifiers,) if isinstance(classifiers, str) else tuple(classifiers)
    state = {k: v for k, v in state.items() if not any(k == c or k.startswith(c + ".") for c in classifiers)}
    first = cfg.get("first_conv")
    own = backbone.state_dict()
    for conv in ((first,) if isinstance(first, str) else tuple(first or ())):
        key = f"{conv}.weight"
        if key in state and key in own and state[key].shape[1] != own[key].shape[1]:
            from timm.models import adapt_input_conv

            state[key] = adapt_input_conv(own[key].shape[1], state[key])
    shapes = [k for k in state if k in own and state[k].shape != own[k].shape]
    missing = [k for k in own if k not in state]
    unexpected = [] if allow_unexpected else [k for k in state if k not in own]
    if not (missing or unexpected or shapes):
        backbone.load_state_dict({k: v for k, v in state.items() if k in own}, strict=True)
    else:
        raise ValueError(f"{fn}: {path!r} does not fit the backbone (got missing {sorted(missing)[:5]}, unexpected "
                         f"{sorted(unexpected)[:5]}, mismatched shapes {shapes[:5]}); save the weights of the same "
                         "timm architecture")
