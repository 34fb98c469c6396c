"""Reliability rules over the whole registry (docs/conventions.md: masks, mixed precision, degenerate
inputs, one exception type per mistake, resumable randomness, data checks under torch.compile).

Each test compares against an independent computation: the fp32 result for autocast, the loss on
the reduced input for ``-inf`` masks, exact zeros for all-ignored batches, an uninterrupted run for
the resume test.
"""

from __future__ import annotations

import inspect
import io
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import losses
from losses.testing import AUTOCAST_TOL, MODEL_AUTOCAST_TOL, check_loss
from tests.reliability_utils import (
    BY_NAME,
    CANDIDATE_SOFTMAX,
    CLASS_SOFTMAX,
    CLASS_WEIGHTED,
    FLAGS,
    ID_TARGETS,
    LOGIT_SOFTMAX,
    NAMES,
    SEEDED,
    SOFT_TARGETS,
    assert_documented_error,
    build,
    call,
    class_kwargs,
    example,
    function_of_module,
    grads_of,
    reductions_for,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --------------------------------------------------------------------------------------
# data checks of the mapping functions and of in_batch_scores
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "posinf"])
@pytest.mark.parametrize("fn_name", ["sparsemax", "entmax15", "entmax_bisect", "gumbel_activation"])
def test_mapping_functions_reject_nan_and_pos_inf_and_keep_neg_inf_as_probability_0(fn_name, value):
    fn = getattr(losses, fn_name)
    x = torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.0, -0.5]], dtype=torch.float64)
    bad = x.clone()
    bad[1, 1] = value
    with pytest.raises(ValueError, match=rf"^{fn_name}: input contains NaN or \+inf \(got 1 {'NaN' if math.isnan(value) else '[+]inf'}\)"):
        fn(bad)
    masked = x.clone()
    masked[1, 1] = -math.inf
    p = fn(masked)
    assert p[1, 1] == 0 and torch.isfinite(p).all()
    if fn_name != "gumbel_activation":  # a softmax-like mapping: the same as without the entry
        torch.testing.assert_close(p[1, [0, 2]], fn(x[1:, [0, 2]])[0], rtol=1e-12, atol=1e-12)
    with losses.validation(False):
        fn(bad)  # no data check, no host sync: nothing raises


@pytest.mark.parametrize("name", ["query", "keys"])
def test_in_batch_scores_rejects_non_finite_embeddings(name):
    q, k = torch.randn(3, 4), torch.randn(3, 4)
    (q if name == "query" else k)[1, 2] = math.nan
    with pytest.raises(ValueError, match=rf"^in_batch_scores: {name} contains NaN or infinite values \(got 1 NaN\)"):
        losses.in_batch_scores(q, k, torch.arange(3))


# --------------------------------------------------------------------------------------
# mixed precision: CPU bf16 autocast, forward and backward, every entry
# --------------------------------------------------------------------------------------

def test_autocast_tolerances():
    """Inside autocast the loss's maths, a head's logits included, runs in fp32 (or wider), as
    F.cross_entropy does: the value equals the fp32 run on the same inputs up to summation order.
    The adversarial loss calls the user's model, which autocast runs in half precision: wider."""
    assert AUTOCAST_TOL == {"rtol": 1e-5, "atol": 1e-6}
    assert MODEL_AUTOCAST_TOL == {"rtol": 3e-2, "atol": 3e-2}


@pytest.mark.parametrize("name", NAMES)
def test_cpu_bf16_autocast_forward_backward(name):
    """Forward under autocast, backward after it (the AMP recipe): the fp32 value and gradients
    (``AUTOCAST_TOL``; ``MODEL_AUTOCAST_TOL`` where the loss runs the user's model). Then forward and
    backward both inside the autocast region: finite, in the leaves' dtypes. The checks are the
    library's kit (``losses.testing``, property ``"autocast"``)."""
    check_loss(name, properties=["autocast"])


@pytest.mark.parametrize("fn_name", ["sparsemax", "entmax15", "entmax_bisect"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mapping_functions_return_the_input_dtype(fn_name, dtype):
    fn = getattr(losses, fn_name)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    p = fn(x)
    assert p.dtype == dtype
    ref = fn(x.float())
    torch.testing.assert_close(p.float(), ref, rtol=0, atol=2 ** -7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fn(x).dtype == dtype


# --------------------------------------------------------------------------------------
# -inf masks equal the loss on the reduced input; zero gradient at masked entries
# --------------------------------------------------------------------------------------

N_MASK, C_MASK = 4, 6


def _logit_case():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N_MASK, C_MASK, generator=g, dtype=torch.float64) * 2
    t = torch.tensor([0, 3, 5, 2])
    mask = torch.zeros(N_MASK, C_MASK, dtype=torch.bool)
    mask[1, 0] = True  # one class removed
    mask[2, [0, 2, 4]] = True  # three removed
    mask[3, [0, 1, 4, 5]] = True  # two classes left
    assert not mask[torch.arange(N_MASK), t].any()
    return x, t, mask


def _reduced_rows(x, t, mask):
    """Row i with its masked classes removed, and the target id remapped."""
    rows = []
    for i in range(x.shape[0]):
        keep = ~mask[i]
        xi = x[i, keep].unsqueeze(0)
        ti = int(keep[: int(t[i])].sum())
        rows.append((xi, torch.tensor([ti])))
    return rows


LOGIT_MASK_CASES = [(n, {}) for n in LOGIT_SOFTMAX] + [("cross_entropy", {"label_smoothing": 0.1})]


@pytest.mark.parametrize("name,extra", LOGIT_MASK_CASES, ids=[f"{n}{'-ls' if e else ''}" for n, e in LOGIT_MASK_CASES])
def test_neg_inf_logits_mask_equals_reduced_input(name, extra):
    spec = BY_NAME[name]
    x, t, mask = _logit_case()
    xm = x.masked_fill(mask, -math.inf).requires_grad_(True)
    module = build(spec, reduction="none", **extra, **class_kwargs(spec, C_MASK))
    out = call(module, (xm, t))  # data checks on: -inf is a mask here, not "non-finite input"
    assert out.shape == (N_MASK,)
    (grad,) = torch.autograd.grad(out.sum(), xm)
    assert torch.all(grad[mask] == 0), "gradient at a masked class must be exactly 0"
    for i, (xi, ti) in enumerate(_reduced_rows(x, t, mask)):
        xi = xi.clone().requires_grad_(True)
        # the per-class tensors of the removed classes go with them
        ref = call(build(spec, reduction="none", **extra, **class_kwargs(spec, C_MASK, keep=~mask[i])), (xi, ti))
        torch.testing.assert_close(out[i], ref[0], rtol=1e-10, atol=1e-12)
        (gi,) = torch.autograd.grad(ref.sum(), xi)
        torch.testing.assert_close(grad[i, ~mask[i]], gi[0], rtol=1e-9, atol=1e-12)
    mean = call(build(spec, **extra, **class_kwargs(spec, C_MASK)), (xm, t))
    torch.testing.assert_close(mean, out.mean(), rtol=1e-10, atol=1e-12)


def test_neg_inf_mask_adversarial_comp_sum_function():
    """The functional adversarial comp-sum loss: -inf in both logits tensors removes the class."""
    spec = BY_NAME["adversarial_comp_sum"]
    x, t, mask = _logit_case()
    x_adv = x + 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=x.dtype)
    xm = x.masked_fill(mask, -math.inf).requires_grad_(True)
    xam = x_adv.masked_fill(mask, -math.inf).requires_grad_(True)
    out = spec.function(xm, xam, t, nu=1.0, reduction="none")
    g, ga = torch.autograd.grad(out.sum(), (xm, xam))
    assert torch.all(g[mask] == 0) and torch.all(ga[mask] == 0)
    for i in range(N_MASK):
        keep = ~mask[i]
        ti = torch.tensor([int(keep[: int(t[i])].sum())])
        ref = spec.function(x[i, keep][None], x_adv[i, keep][None], ti, nu=1.0, reduction="none")
        torch.testing.assert_close(out[i], ref[0], rtol=1e-10, atol=1e-12)


def _candidate_case():
    g = torch.Generator().manual_seed(5)
    b, l = 4, 8
    s = torch.randn(b, l, generator=g, dtype=torch.float64)
    target = torch.zeros(b, l, dtype=torch.bool)
    target[0, 1] = True
    target[1, [2, 5]] = True
    target[2, 7] = True
    target[3, [0, 3]] = True
    mask = torch.zeros(b, l, dtype=torch.bool)
    mask[0, [0, 4]] = True  # false negatives excluded
    mask[2, [1, 2, 3]] = True
    mask[3, 6] = True
    assert not (mask & target).any()
    return s, target, mask


@pytest.mark.parametrize("how", ["mask", "neg_inf"])
@pytest.mark.parametrize("name", CANDIDATE_SOFTMAX)
def test_candidate_mask_equals_reduced_input(name, how):
    spec = BY_NAME[name]
    s, target, mask = _candidate_case()
    module = build(spec, reduction="none")
    if how == "mask":
        leaf = s.clone().requires_grad_(True)
        out = call(module, (leaf, target), {"mask": mask})
    else:
        leaf = s.masked_fill(mask, -math.inf).requires_grad_(True)
        out = call(module, (leaf, target))
    assert out.shape == (s.shape[0],)
    (grad,) = torch.autograd.grad(out.sum(), leaf)
    assert torch.all(grad[mask] == 0), "gradient at an excluded candidate must be exactly 0"
    tol = {"rtol": 1e-6, "atol": 1e-8} if name == "soft_topk" else {"rtol": 1e-10, "atol": 1e-12}
    for i in range(s.shape[0]):
        keep = ~mask[i]
        si = s[i, keep][None].clone().requires_grad_(True)
        ref = call(build(spec, reduction="none"), (si, target[i, keep][None]))
        torch.testing.assert_close(out[i], ref[0], **tol)
        (gi,) = torch.autograd.grad(ref.sum(), si)
        torch.testing.assert_close(grad[i, keep], gi[0], **tol)


def test_in_batch_scores_takes_a_mask():
    g = torch.Generator().manual_seed(6)
    q = torch.randn(4, 3, generator=g, dtype=torch.float64)
    k = torch.randn(4, 3, generator=g, dtype=torch.float64)
    t = torch.arange(4)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[0, 2] = True
    mask[3, 1] = True
    scores = losses.in_batch_scores(q, k, t, mask=mask)[0]
    expected = (q @ k.T).masked_fill(mask, -math.inf)
    torch.testing.assert_close(scores, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", CANDIDATE_SOFTMAX)
def test_mask_removing_a_positive_is_a_value_error(name):
    spec = BY_NAME[name]
    s, target, mask = _candidate_case()
    mask = mask.clone()
    mask[1, 5] = True  # a positive
    with pytest.raises(ValueError) as info:
        call(build(spec), (s, target), {"mask": mask})
    assert_documented_error(spec, info.value, (ValueError,))


@pytest.mark.parametrize("name", LOGIT_SOFTMAX + CANDIDATE_SOFTMAX)
def test_row_without_a_finite_entry_is_a_value_error(name):
    spec = BY_NAME[name]
    if name in CANDIDATE_SOFTMAX:
        s, target, _ = _candidate_case()
        s = s.clone()
        s[2] = -math.inf
        args = (s, target)
    else:
        x, t, _ = _logit_case()
        x = x.clone()
        x[2] = -math.inf
        args = (x, t)
    ckw = class_kwargs(spec, C_MASK) if spec.kind == "logits" else {}
    with pytest.raises(ValueError) as info:
        call(build(spec, **ckw), args)
    assert_documented_error(spec, info.value, (ValueError,))
    with losses.validation(False):  # a data check: off with validation
        try:
            call(build(spec, **ckw), args)
        except ValueError as exc:  # pragma: no cover - the failure message says what ran
            pytest.fail(f"data check ran with validation off: {exc}")


@pytest.mark.parametrize("name", LOGIT_SOFTMAX)
def test_target_on_a_masked_class_is_inf_or_names_the_row(name):
    spec = BY_NAME[name]
    x, t, mask = _logit_case()
    xm = x.clone()
    xm[1, int(t[1])] = -math.inf
    xm = xm.requires_grad_(True)
    try:
        out = call(build(spec, reduction="none", **class_kwargs(spec, C_MASK)), (xm, t))
    except ValueError as exc:
        assert_documented_error(spec, exc, (ValueError,))
        assert "row" in str(exc), str(exc)
        return
    assert out[1].item() == math.inf, out
    assert torch.isfinite(out[[0, 2, 3]]).all()
    (grad,) = torch.autograd.grad(out.sum(), xm)
    assert not torch.isnan(grad).any()


@pytest.mark.parametrize("value", [math.inf, math.nan], ids=["pos_inf", "nan"])
@pytest.mark.parametrize("name", LOGIT_SOFTMAX + CANDIDATE_SOFTMAX)
def test_pos_inf_and_nan_are_still_rejected(name, value):
    """-inf is a mask in these families; +inf and NaN stay non-finite input (data check)."""
    spec = BY_NAME[name]
    if name in CANDIDATE_SOFTMAX:
        s, target, _ = _candidate_case()
        s = s.clone()
        s[1, 0] = value
        args = (s, target)
    else:
        x, t, _ = _logit_case()
        x = x.clone()
        x[1, 1] = value
        args = (x, t)
    with pytest.raises(ValueError) as info:
        call(build(spec, **(class_kwargs(spec, C_MASK) if spec.kind == "logits" else {})), args)
    assert_documented_error(spec, info.value, (ValueError,))


@pytest.mark.parametrize("name", ["z_loss", "gol"])
def test_neg_inf_where_a_class_cannot_be_excluded(name):
    """Z-loss standardises over all classes, GOL is a per-class sigmoid: either a documented
    ValueError, or a defined value (no NaN in value or gradient)."""
    spec = BY_NAME[name]
    x, t, _ = _logit_case()
    x = x.clone()
    x[1, 1] = -math.inf  # not a target (t[1] == 3)
    x = x.requires_grad_(True)
    try:
        out = call(build(spec), (x, t))
    except ValueError as exc:
        assert_documented_error(spec, exc, (ValueError,))
        return
    assert not torch.isnan(out).any(), out
    (grad,) = torch.autograd.grad(out, x)
    assert not torch.isnan(grad).any()


# --------------------------------------------------------------------------------------
# all-ignored batches containing +-inf, validation off: exact 0, zero gradients, never NaN
# --------------------------------------------------------------------------------------


def _with_infs(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().clone()
    flat = t.view(-1)
    flat[0] = math.inf
    if flat.numel() > 1:
        flat[-1] = -math.inf
    return t.requires_grad_(True)


@pytest.mark.parametrize("name", NAMES)
def test_all_ignored_batch_with_infs_is_exact_zero(name):
    spec = BY_NAME[name]
    if spec.inputs[0] != "model":  # the kit's "all_ignored" property: plain and with +-inf inputs
        check_loss(name, properties=["all_ignored"])
        return
    for reduction in reductions_for(spec):
        if reduction == "none":
            continue
        # the functional form: the model's outputs would carry the infinities
        x = _with_infs(torch.randn(6, 5, dtype=torch.float64))
        xa = _with_infs(torch.randn(6, 5, dtype=torch.float64))
        t = torch.full((6,), -100)
        with losses.validation(False):
            out = spec.function(x, xa, t, nu=1.0, reduction=reduction)
        leaves = [x, xa]
        assert out.shape == ()
        assert out.item() == 0.0, f"{reduction}: {out.item()}"
        assert out.grad_fn is not None, "graph-attached"
        for leaf, g in zip(leaves, grads_of(out, leaves)):
            assert g is not None, "zero (not None) gradients"
            assert not torch.isnan(g).any(), f"{reduction}: NaN gradient for a {tuple(leaf.shape)} leaf"
            assert torch.all(g == 0), f"{reduction}: nonzero gradient"


# --------------------------------------------------------------------------------------
# degenerate inputs that would train nothing are errors
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 1), (2, 1, 3)], ids=["N1", "N1d"])
@pytest.mark.parametrize("name", CLASS_SOFTMAX)
def test_single_class_logits_are_a_value_error(name, shape):
    spec = BY_NAME[name]
    x = torch.randn(shape, dtype=torch.float64)
    t = torch.zeros((shape[0],) + shape[2:], dtype=torch.long)
    with pytest.raises(ValueError) as info:
        if spec.inputs[0] == "model":
            spec.function(x, x.clone(), t, nu=1.0)
        else:
            call(build(spec, **class_kwargs(spec, shape[1])), (x, t))
    assert_documented_error(spec, info.value, (ValueError,))
    assert "bce_with_logits" in str(info.value), str(info.value)


@pytest.mark.parametrize("name", SOFT_TARGETS)
def test_soft_targets_must_sum_to_one(name):
    spec = BY_NAME[name]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64)
    q = torch.softmax(torch.randn(5, 4, generator=g, dtype=torch.float64), dim=1)
    ckw = class_kwargs(spec, 4)
    ok = call(build(spec, **ckw), (x, q))  # a proper distribution is accepted
    assert torch.isfinite(ok)
    bad = q.clone()
    bad[3] *= 0.5
    with pytest.raises(ValueError) as info:
        call(build(spec, **ckw), (x, bad))
    assert_documented_error(spec, info.value, (ValueError,))
    assert ".long()" not in str(info.value), "hint must not suggest casting soft targets to ids"
    with losses.validation(False):  # a data check
        call(build(spec, **ckw), (x, bad))


@pytest.mark.parametrize("weight", ["negative", "all_zero"])
@pytest.mark.parametrize("name", CLASS_WEIGHTED)
def test_bad_class_weights_are_a_value_error(name, weight):
    spec = BY_NAME[name]
    args, kwargs = example(spec, dtype=torch.float64)
    c = args[0].shape[1]
    w = torch.ones(c, dtype=torch.float64)
    if weight == "negative":
        w[1] = -0.5
    else:
        w.zero_()
    with pytest.raises(ValueError) as info:
        call(build(spec, weight=w), args, kwargs)
    assert_documented_error(spec, info.value, (ValueError,))


# --------------------------------------------------------------------------------------
# one exception type per mistake
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ID_TARGETS))
def test_float_labels_are_a_type_error(name):
    spec = BY_NAME[name]
    args, kwargs = example(spec)
    bad = args[:-1] + (args[-1].float(),)
    with pytest.raises(TypeError) as info:
        call(build(spec), bad, kwargs)
    assert_documented_error(spec, info.value, (TypeError,))
    # float labels may be soft targets: casting them with .long() would silently corrupt them
    assert ".long()" not in str(info.value), str(info.value)


@pytest.mark.parametrize("value", [1, "yes"], ids=["int", "str"])
@pytest.mark.parametrize("name,flag", FLAGS, ids=[f"{n}-{f}" for n, f in FLAGS])
def test_non_bool_flag_is_a_type_error(name, flag, value):
    spec = BY_NAME[name]
    with pytest.raises(TypeError) as info:
        module = build(spec, **{flag: value})
        args, kwargs = example(spec)
        call(module, args, kwargs)
    assert_documented_error(spec, info.value, (TypeError,))


@pytest.mark.parametrize("seed", [1.5, "0"], ids=["float", "str"])
@pytest.mark.parametrize("name", SEEDED)
def test_non_integer_seed_is_a_type_error(name, seed):
    spec = BY_NAME[name]
    with pytest.raises(TypeError) as info:
        module = build(spec, seed=seed)
        args, kwargs = example(spec)
        call(module, args, kwargs)
    assert_documented_error(spec, info.value, (TypeError,))


#: Every entry whose module takes ``ignore_index``.
IGNORE_INDEX = [n for n in NAMES if "ignore_index" in inspect.signature(BY_NAME[n].module.__init__).parameters]


@pytest.mark.parametrize("value", [-100.0, "x", None, True], ids=["float", "str", "none", "bool"])
@pytest.mark.parametrize("name", IGNORE_INDEX)
def test_non_integer_ignore_index_is_a_type_error(name, value):
    """One exception type per mistake: a non-integer ``ignore_index`` is ``TypeError`` from the
    constructor and from the function (called with the module's other hyperparameters; a
    configuration check, so also with data checks off), and from a module whose attribute was
    changed after construction."""
    spec = BY_NAME[name]
    with pytest.raises(TypeError) as info:
        build(spec, ignore_index=value)
    assert str(info.value).startswith(spec.module.__name__ + ":") and "ignore_index" in str(info.value)
    module = build(spec)
    args, kwargs = example(spec)
    call(module, args, kwargs)  # Partial FC: function_of_module reuses the module's last_index
    module.ignore_index = value
    for checks in (True, False):
        with losses.validation(checks):
            with pytest.raises(TypeError) as info:
                call(module, args, kwargs)
            assert_documented_error(spec, info.value, (TypeError,))
            assert "ignore_index" in str(info.value)
            if spec.inputs[0] != "model":  # the adversarial module runs its attack before the function
                with pytest.raises(TypeError) as info:
                    function_of_module(spec, module, args, kwargs)
                assert str(info.value).startswith(spec.function.__name__ + ":"), str(info.value)
                assert "ignore_index" in str(info.value)


def test_in_batch_scores_rejects_a_mask_that_removes_a_positive():
    """The data check of the ranking losses, already where the scores are built (integer ids, a
    padded id list and a bool target); a mask off the positives passes."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    eye = torch.eye(3, dtype=torch.bool)
    for target in (torch.arange(3), torch.tensor([[0, -100], [1, 2], [2, -100]]), eye):
        with pytest.raises(ValueError, match=r"^in_batch_scores: mask removes a positive \(got rows \[0, 1, 2\]\)"):
            losses.in_batch_scores(q, k, target, mask=eye)
    off = eye.roll(1, dims=1)
    scores, _ = losses.in_batch_scores(q, k, torch.arange(3), mask=off)
    assert torch.isinf(scores[off]).all() and torch.isfinite(scores[~off]).all()
    with losses.validation(False):  # data checks off: the -inf is placed, nothing raises
        scores, _ = losses.in_batch_scores(q, k, torch.arange(3), mask=eye)
    assert torch.isinf(scores.diagonal()).all()


BAD_VALUES = [
    ("z_loss", {"a": 0.0}), ("z_loss", {"eps": 0.0}),
    ("logz_penalty", {"coef": -1.0}),
    ("comp_sum", {"tau": -1.0}),
    ("adversarial_comp_sum", {"rho": 0.0}), ("adversarial_comp_sum", {"nu": -1.0}),
    ("adversarial_comp_sum", {"steps": -1}),
    ("entmax_bisect", {"alpha": 1.0}),
    ("gol", {"label_smoothing": 1.0}),
    ("cross_entropy", {"label_smoothing": 1.5}),
    ("dice_semimetric", {"smooth": -1.0}), ("jaccard_metric", {"smooth": -1.0}), ("soft_dice", {"smooth": -1.0}),
    ("decoupled_softmax", {"temperature": 0.0}),
    ("infonce", {"temperature": 0.0}),
    ("soft_topk", {"alpha": 0.0}), ("soft_topk", {"k": 0}), ("soft_topk", {"temperature": -1.0}),
    ("psl", {"temperature": 0.0}), ("psl", {"score_scale": 0.0}),
    ("sampled_softmax", {"temperature": 0.0}),
    ("nbc_softmax", {"scale": -1.0}), ("nbc_softmax", {"nbc_weight": 1.5}),
    ("partial_fc", {"sample_rate": 1.5}), ("partial_fc", {"sample_rate": 0.0}),
]


@pytest.mark.parametrize("name,kw", BAD_VALUES, ids=[f"{n}-{k}={v}" for n, d in BAD_VALUES for k, v in d.items()])
def test_bad_value_is_a_value_error(name, kw):
    spec = BY_NAME[name]
    with pytest.raises(ValueError) as info:
        module = build(spec, **kw)
        args, kwargs = example(spec)
        call(module, args, kwargs)
    assert_documented_error(spec, info.value, (ValueError,))


# --------------------------------------------------------------------------------------
# resumable randomness: the generator travels in the state_dict
# --------------------------------------------------------------------------------------


def _seeded_setup(name):
    """Module keywords and a fixed input under which each call draws fresh random numbers."""
    spec = BY_NAME[name]
    g = torch.Generator().manual_seed(11)
    if name == "partial_fc":
        kw = {"embedding_dim": 8, "num_classes": 50, "sample_rate": 0.5, "seed": 3}
        args = (torch.randn(6, 8, generator=g), torch.tensor([0, 1, 2, 0, 1, 2]))
    elif name == "adversarial_comp_sum":
        kw = {"nu": 1.0, "seed": 3, "steps": 1}
        args, _ = spec.example_inputs(generator=g, dtype=torch.float32, case="random")
    else:
        b, l = 4, 10
        target = torch.zeros(b, l, dtype=torch.bool)
        target[:, :4] = True  # four positives per row: the sampled one(s) change from call to call
        kw = {"seed": 3, "variant": "reference"}
        if name == "soft_topk":
            kw["k"] = 2
        args = (torch.randn(b, l, generator=g), target)
    return kw, args


def _draws(module, args, steps):
    outs = []
    for _ in range(steps):
        out = call(module, args)
        outs.append(out.detach().clone())
        if getattr(module, "last_index", None) is not None:
            outs.append(module.last_index.detach().clone().double())
    return outs


@pytest.mark.parametrize("name", SEEDED)
def test_resume_from_state_dict_draws_what_the_uninterrupted_run_draws(name):
    spec = BY_NAME[name]
    kw, args = _seeded_setup(name)
    k, m = 3, 3
    run = build(spec, **kw)
    _draws(run, args, k)
    buf = io.BytesIO()
    torch.save(run.state_dict(), buf)
    continued = _draws(run, args, m)

    resumed = build(spec, **kw)
    buf.seek(0)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    after = _draws(resumed, args, m)
    fresh = _draws(build(spec, **kw), args, m)
    # the draws differ from step to step, so a resume that restarts the generator is caught
    assert any(not torch.equal(a, b) for a, b in zip(fresh, continued)), "test setup draws nothing random"
    for a, b in zip(after, continued):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", SEEDED)
def test_state_dict_without_generator_still_loads(name):
    """Older checkpoints (parameters only) load."""
    spec = BY_NAME[name]
    kw, args = _seeded_setup(name)
    module = build(spec, **kw)
    params = {k: v for k, v in module.state_dict().items() if k in dict(module.named_parameters())}
    fresh = build(spec, **kw)
    fresh.load_state_dict(params)
    assert torch.isfinite(call(fresh, args))


# --------------------------------------------------------------------------------------
# data checks cannot run inside torch.compile: said once per process
# --------------------------------------------------------------------------------------

_COMPILE_SCRIPT = textwrap.dedent(
    """
    import warnings, torch, losses
    x = torch.randn(4, 5, requires_grad=True)
    t = torch.tensor([0, 1, 2, 3])
    s = torch.randn(4, 6)
    st = torch.zeros(4, 6, dtype=torch.bool); st[:, 0] = True

    def run(validation):
        torch._dynamo.reset()
        ce = torch.compile(losses.CrossEntropyLoss(), backend="eager")
        nce = torch.compile(losses.InfoNCELoss(), backend="eager")
        with losses.validation(validation), warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            ce(x, t).backward()
            ce(x[:3], t[:3])  # a new shape: traced again
            nce(s, st)
        return [str(w.message) for w in rec
                if issubclass(w.category, UserWarning) and "losses.validation(False)" in str(w.message)]

    off = run(False)
    on = run(True)
    again = run(True)
    print("OFF", len(off)); print("ON", len(on)); print("AGAIN", len(again))
    """
)


@pytest.mark.slow
def test_compile_with_validation_on_warns_once_per_process():
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    counts = dict(line.split() for line in res.stdout.splitlines() if line.split()[0] in ("OFF", "ON", "AGAIN"))
    assert counts["OFF"] == "0", "no warning with validation off"
    assert counts["ON"] == "1", f"expected one UserWarning naming losses.validation(False), got {counts['ON']}"
    assert counts["AGAIN"] == "0", "once per process"


# --------------------------------------------------------------------------------------
# "sum" / "mean" follow the unit weights in float32 too, at large logits (x10)
# --------------------------------------------------------------------------------------


LARGE_CASES = [(n, "x10") for n in NAMES if BY_NAME[n].unit != "batch"
               and BY_NAME[n].inputs[0] in ("input", "embeddings", "scores")]
LARGE_CASES += [(n, "confident") for n in NAMES if BY_NAME[n].unit != "batch" and BY_NAME[n].inputs[0] == "input"]


@pytest.mark.parametrize("name,case", LARGE_CASES, ids=[f"{n}-{c}" for n, c in LARGE_CASES])
def test_float32_reductions_follow_unit_weights_at_large_logits(name, case):
    """fp32 tolerance (1e-5 relative to the summed magnitudes): a reduction that sums a large
    background and subtracts it again loses the small per-unit values. ``confident``: logits
    +-8..12 with the target's class high, every other class low (a well-trained model)."""
    spec = BY_NAME[name]
    args, kwargs = example(spec, requires_grad=False)
    x = args[0]
    if case == "x10":
        x = x * 10
    else:
        t = args[1]
        onehot = torch.zeros_like(x, dtype=torch.bool)
        valid = t != -100
        onehot.scatter_(1, t.clamp_min(0).unsqueeze(1), valid.unsqueeze(1))
        mag = 8 + 4 * torch.rand(x.shape, generator=torch.Generator().manual_seed(9))
        x = torch.where(onehot, mag, -mag)
    args = (x,) + args[1:]
    none = call(build(spec, reduction="none"), args, kwargs).double()
    total = call(build(spec, reduction="sum"), args, kwargs).double()
    mean = call(build(spec, reduction="mean"), args, kwargs).double()
    w = spec.unit_weights(*args, **{**spec.example_kwargs, **kwargs}).double()
    scale = float((w * none.abs()).sum()) + 1e-30
    ref = float((w * none).sum())
    assert abs(float(total) - ref) <= 1e-5 * scale, (float(total), ref)
    assert abs(float(mean) - ref / float(w.sum())) <= 1e-5 * scale / float(w.sum()), (float(mean), ref / float(w.sum()))
