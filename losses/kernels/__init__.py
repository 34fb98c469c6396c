"""Every kernel of the library, in one place, and the one rule that decides when one runs.

Two kinds of kernel live here, each beside a PyTorch path that gives the same values (to float
rounding) and is always the fallback:

* **C kernels for the CPU** (:mod:`.entmax_native`, :mod:`.dice_native`, :mod:`.rows_native`, built
  on first use by the system's C compiler through :mod:`._native`): the sparsemax / entmax-1.5
  threshold search, the Dice family's fused softmax and sums, and the value and gradient of GOL,
  the log-Z penalty, comp-sum and the Z-loss. ``LOSSES_NATIVE=0`` switches them off.
* **Triton kernels for the GPU** (:mod:`.triton_rows`): one fused row kernel for the softmax
  cross-entropy family (cross-entropy with class weights, ``ignore_index``, label smoothing,
  soft-capping and a per-class logit shift; the log-Z penalty; logit-adjusted cross-entropy and
  balanced softmax, comp-sum and focal), one for the Z-loss, one for the element-wise BCE and GOL,
  one for the sparsemax / 1.5-entmax losses (:mod:`.triton_rows`) and the LM head of
  :func:`losses.linear_cross_entropy` (:mod:`.triton_linear`). Triton ships with the CUDA builds of
  PyTorch, so GPU users need nothing more. ``LOSSES_TRITON=0`` switches them off.

**The dispatch rule** (:func:`use_triton`): a loss takes its Triton kernel when the tensor is on a
CUDA device, ``triton`` imports, the kernels are not switched off, the dtype is float32, bfloat16 or
float16 (float64 keeps the exact PyTorch path) and the loss's options are ones the kernel supports
(each loss says which); otherwise it takes the PyTorch path. Loss files never import ``triton``:
they ask :func:`use_triton` and call the functions of :mod:`.triton_rows`.

:func:`losses.native_kernels` reports every kernel: in use, or why not.

For tests and for machines without a GPU, Triton's interpreter runs the same kernels on CPU
tensors, slowly: start Python with ``TRITON_INTERPRET=1`` in the environment (Triton reads it when
``torch`` imports it) and run the losses inside ``with losses.kernels.interpret():``; CPU tensors
then take the kernels too. Outside that block CPU tensors always take the PyTorch path.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["use_triton", "triton_status", "triton_disabled", "interpret", "interpreting", "interpreter_ready",
           "triton_rows_module"]

_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INTERPRET_FORCED = False
_STATUS: Optional[Tuple[bool, str]] = None


def triton_disabled() -> bool:
    """``LOSSES_TRITON=0`` (or false / no / off) in the environment."""
    return os.environ.get("LOSSES_TRITON", "1").strip().lower() in ("0", "false", "no", "off")


def interpreter_ready() -> bool:
    """Whether Triton was imported in interpreter mode (``TRITON_INTERPRET=1`` set before the
    first ``import torch`` / ``import triton`` of the process)."""
    if not triton_status()[0]:
        return False
    import triton.language as tl

    return type(tl.standard.max).__name__ == "InterpretedFunction"


def interpreting() -> bool:
    """Whether CPU tensors take the Triton kernels (inside :func:`interpret`)."""
    return _INTERPRET_FORCED


@contextlib.contextmanager
def interpret(enabled: bool = True) -> Iterator[None]:
    """Run the Triton kernels on CPU tensors through Triton's interpreter inside the block (tests,
    debugging on a machine without a GPU). Slow: meant for small shapes. Needs ``TRITON_INTERPRET=1``
    in the environment before the process first imported ``torch`` (``RuntimeError`` otherwise)."""
    global _INTERPRET_FORCED
    if enabled and not interpreter_ready():
        raise RuntimeError(
            "losses.kernels.interpret: Triton is not in interpreter mode in this process; start Python with "
            "TRITON_INTERPRET=1 in the environment (it must be set before torch is imported)")
    previous = _INTERPRET_FORCED
    _INTERPRET_FORCED = bool(enabled)
    try:
        yield
    finally:
        _INTERPRET_FORCED = previous


def triton_status() -> Tuple[bool, str]:
    """``(importable, detail)``: whether ``triton`` imports here (its version), or why not."""
    global _STATUS
    if _STATUS is None:
        try:
            import triton  # noqa: F401
            import triton.language  # noqa: F401

            _STATUS = (True, f"triton {triton.__version__}")
        except Exception as exc:  # ImportError, or a broken install
            _STATUS = (False, f"triton does not import ({type(exc).__name__}: {str(exc)[:120]})")
    return _STATUS


def use_triton(x: Tensor) -> bool:
    """The dispatch rule: True when ``x`` should go through a Triton kernel (a CUDA tensor, or a
    CPU tensor while :func:`interpreting`; float32 / bfloat16 / float16; ``triton`` importable; not
    switched off by ``LOSSES_TRITON=0``). A loss adds its own conditions on its options."""
    if x.dtype not in _KERNEL_DTYPES or triton_disabled():
        return False
    dev = x.device.type
    if dev == "cuda":
        if torch.version.hip is not None:  # the kernels are written and measured for NVIDIA GPUs
            return False
    elif not (dev == "cpu" and interpreting()):
        return False
    return triton_status()[0]


def triton_rows_module():
    """The Triton kernel module (:mod:`.triton_rows`), imported on first use: the loss files call
    its functions through this, and never import ``triton`` themselves."""
    from . import triton_rows

    return triton_rows


def report() -> dict:
    """``{name: (in_use, detail)}`` for the Triton kernels (see :func:`losses.native_kernels`)."""
    ok, detail = triton_status()
    names = ("softmax_rows", "z_loss_rows")
    if triton_disabled():
        state = (False, f"disabled by LOSSES_TRITON=0 ({detail})")
    elif not ok:
        state = (False, detail)
    elif not torch.cuda.is_available():
        state = (False, f"{detail}; no CUDA device here: used on CUDA tensors only"
                        + (" (and on CPU tensors through the interpreter, which is on)" if interpreting() else ""))
    else:
        state = (True, f"{detail} on {torch.cuda.get_device_name(0)} (CUDA tensors)")
    return {n: state for n in names}


def _register() -> None:
    """Import the Triton kernel module where ``triton`` imports, so that its custom operators exist
    before any ``torch.compile`` trace meets them (registering them while dynamo traces is not
    allowed). The kernels themselves are jitted on first use."""
    if triton_status()[0]:
        try:
            from . import triton_rows  # noqa: F401
        except Exception as exc:  # pragma: no cover - a triton too old for the kernels' language
            global _STATUS
            _STATUS = (False, f"the Triton kernels do not load ({type(exc).__name__}: {str(exc)[:120]})")


_register()
