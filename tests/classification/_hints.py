"""Follow an error message's hint literally: the test names the code it expects the hint to
contain, checks that the message contains exactly that code, and runs it (with ``input`` and
``target`` bound to the tensors of the failed call). A hint whose advice no longer works, or
whose wording no longer names the code, fails the test."""

from __future__ import annotations

import pytest
import torch

import losses


def raise_and_follow(call, exc, code, input: torch.Tensor, target: torch.Tensor):
    """``call()`` must raise ``exc`` whose message contains ``code`` (an expression, or a tuple of
    them, e.g. the new ``input`` and the new ``target``); returns ``code`` evaluated (a tuple for a
    tuple) with ``losses``, ``torch``, ``input`` and ``target`` in scope."""
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    codes = (code,) if isinstance(code, str) else tuple(code)
    for c in codes:
        assert c in msg, f"the hint no longer names {c!r}: {msg}"
    scope = {"losses": losses, "torch": torch, "input": input, "target": target}
    out = tuple(eval(c, scope) for c in codes)  # noqa: S307 - the test's own expressions, found in the hint
    return out[0] if isinstance(code, str) else out
