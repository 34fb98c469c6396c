"""Register a loss of your own and check it with the library's contract kit.

    python examples/custom_loss.py
    python -m losses.testing examples/custom_loss.py   # the kit's command: one line per property

This file defines the Poly-1 loss (Z. Leng et al., PolyLoss: A Polynomial Expansion Perspective of
Classification Loss Functions, ICLR 2022, arXiv:2204.12511), cross-entropy plus
``epsilon (1 - p_t)``, in user code, as you would define any loss of your own (whether or not the
library has a loss of the same maths: ``main`` lists the library entries that cite the same paper).
It registers it under the name ``my_poly1`` (user entries take a name of their own, e.g. with a
``my_`` prefix, so that no library loss ever takes it) with ``losses.register`` (as a class
decorator), builds it by name with ``losses.create_loss`` and runs ``losses.testing.check_loss`` on
it: the checks every built-in loss passes (``docs/contributing.md``, Adding a loss), among them
``"gradients"``, a float64 ``torch.autograd.gradcheck`` of every reduction (a term detached by
mistake fails it). A registered loss is also routed by the Lightning modules
(``lightning_modules/routing.py``) by its declared ``inputs``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import losses
from losses.testing import check_loss

REDUCTIONS = ("none", "mean", "sum")


def poly1_unit_weights(input: Tensor, target: Tensor, *, ignore_index: int = -100, **_: object) -> Tensor:
    """One unit per position, weight 1 unless the target is ``ignore_index``."""
    return (target != ignore_index).double()


def poly1_loss(input: Tensor, target: Tensor, *, epsilon: float = 1.0, ignore_index: int = -100,
               reduction: str = "mean") -> Tensor:
    """``-log p_t + epsilon · (1 - p_t)`` per position, ``p_t = softmax(input, dim=1)[target]``.

    ``input``: logits ``(N, C)`` or ``(N, C, d1, ...)``; ``target``: class ids ``(N,)`` or
    ``(N, d1, ...)``. Ignored positions have unit weight 0: they give 0 and leave the ``"mean"``
    denominator; an all-ignored batch gives a graph-attached 0 with zero gradients.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"poly1_loss: reduction must be one of {REDUCTIONS} (got {reduction!r}); use 'mean'")
    if epsilon < -1:
        raise ValueError(f"poly1_loss: epsilon must be >= -1 (got {epsilon}); epsilon=0 is cross-entropy")
    if target.is_floating_point():
        raise TypeError(f"poly1_loss: target must hold class ids (got {target.dtype}); pass an integer tensor")
    # compute in float32 (float64 for float64 inputs), also under autocast
    dtype = torch.float64 if input.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=input.device.type, enabled=False):
        valid = target != ignore_index
        # ignored positions get zero logits before any exp / log: no NaN from their values
        x = input.to(dtype).masked_fill(~valid.unsqueeze(1), 0.0)
        logp = torch.log_softmax(x, dim=1).gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1)
        per = -logp - epsilon * torch.expm1(logp)  # 1 - p_t = -expm1(log p_t), exact near p_t = 1
        none = torch.where(valid, per, torch.zeros_like(per))
        if reduction == "none":
            return none
        w = valid.to(dtype)
        total = (w * none).sum()
        return total if reduction == "sum" else total / w.sum().clamp_min(1.0)


@losses.register(
    "my_poly1",
    function=poly1_loss,
    inputs=losses.InputKind.LOGITS,  # forward(input, target)
    unit="position",
    unit_weights=poly1_unit_weights,
    arxiv="2204.12511",
    paper="Z. Leng et al., PolyLoss: A Polynomial Expansion Perspective of Classification Loss Functions, ICLR 2022",
    example_kwargs={"epsilon": 1.0},
    softmax=True,  # the registry record's facts: see docs/contributing.md
)
class Poly1Loss(nn.Module):
    """Module form of :func:`poly1_loss`."""

    def __init__(self, epsilon: float = 1.0, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"Poly1Loss: reduction must be one of {REDUCTIONS} (got {reduction!r}); use 'mean'")
        self.epsilon, self.ignore_index, self.reduction = float(epsilon), ignore_index, reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return poly1_loss(input, target, epsilon=self.epsilon, ignore_index=self.ignore_index,
                          reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}, ignore_index={self.ignore_index}, reduction={self.reduction!r}"


def main() -> None:
    loss = losses.create_loss("my_poly1", epsilon=2.0)
    x, t = torch.randn(4, 5), torch.tensor([0, 3, -100, 1])
    # epsilon = 0 is cross-entropy
    torch.testing.assert_close(poly1_loss(x, t, epsilon=0.0), F.cross_entropy(x, t))
    print(loss, float(loss(x, t)))
    same_paper = [s.name for s in losses.list_losses() if s.arxiv == "2204.12511" and s.name != "my_poly1"]
    if same_paper:
        print(f"the library's own entries citing PolyLoss: {same_paper}")
    check_loss("my_poly1")  # raises AssertionError naming the property that fails (gradients included)
    check_loss("my_poly1", properties=["compile"])  # torch.compile (aot_eager backend), optional
    print("check_loss('my_poly1'): every contract property holds")


if __name__ == "__main__":
    main()
