"""The C threshold kernel of the sparsemax / entmax-1.5 losses on CPU
(losses/kernels/entmax_native.py).

It replaces the PyTorch dense search where it is built, so it is held to the same float64 loop
oracles as every search (tests/classification/test_sparsemax.py), to the PyTorch search it replaces
(the path where no compiler exists), and to the cases it hands back: NaN / ``+inf`` scores and ids
out of range with the data checks off, a search that does not end. Building is tested for real: a
compiler-less environment, ``LOSSES_NATIVE=0`` and concurrent builds into one empty cache, each in
its own interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import losses
from losses.kernels import _native
from losses.kernels import dice_native, rows_native
from losses.kernels import entmax_native as native
from losses.classification import _entmax_ops as ops
from tests.classification.test_sparsemax import oracle_activation, oracle_loss

NINF = float("-inf")
KINDS = ["sparsemax", "entmax15"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hard_rows(c: int, dtype: torch.dtype, seed: int = 3, rows: int = 24) -> torch.Tensor:
    """Rows that stress an exact threshold search: equal scores, masks, a single finite score,
    ties, evenly spaced and clustered scores, large and tiny scales."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, c, generator=g, dtype=torch.float64)
    x[0] = 0.0  # all equal: the support is the whole row
    x[1] = NINF  # no finite score: zeros
    x[2, 1:] = NINF  # one finite score: p = e_0
    x[3, : c // 2] = NINF
    x[4] = torch.linspace(0, -1.2, c, dtype=torch.float64)  # evenly spaced
    x[5] = -torch.logspace(-6, 0.5, c, dtype=torch.float64)  # clustered at the max
    x[6] = x[6].round()  # ties
    x[7] *= 30.0  # one-hot-like
    x[8] *= 0.01  # near-uniform
    x[9, ::2] = x[9, 1::2][: x[9, ::2].shape[0]] if c % 2 == 0 else x[9, ::2]
    x[10] = 1e6 + torch.randn(c, generator=g, dtype=torch.float64)  # far from 0
    return x.to(dtype)


def test_the_kernel_builds_here():
    ok, why = native.available()
    assert ok, f"the C threshold kernel did not build: {why}"
    assert why.startswith("built with")


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-13), (torch.float32, 3e-6)])
@pytest.mark.parametrize("c", [1, 2, 37, 300, 1000])
@pytest.mark.parametrize("kind", KINDS)
def test_threshold_and_probabilities_match_the_oracle_and_the_torch_search(kind, c, dtype, tol, monkeypatch):
    x = hard_rows(c, dtype)
    found = native.threshold(x, kind == "entmax15")
    assert found is not None
    m, tau, d, s1, s2, s3, cnt = found
    p = d if kind == "sparsemax" else d * d
    # the oracle on the scores shifted by the row max (the same probabilities; unshifted, its sums of
    # scores near 1e6 would carry 1e-10 of rounding)
    shift = x.double().amax(1, keepdim=True)
    expected = oracle_activation(kind, x.double() - torch.where(torch.isfinite(shift), shift, 0.0))
    torch.testing.assert_close(p.double(), expected, rtol=0, atol=tol)
    # the sums are the support's: |S|, sum d, sum d^2, sum d^3
    dd = d.double()
    assert torch.equal(cnt.squeeze(1), (d > 0).sum(1).to(cnt.dtype))
    for got, want in ((s1, dd.sum(1)), (s2, (dd * dd).sum(1)), (s3, (dd ** 3).sum(1))):
        torch.testing.assert_close(got.squeeze(1).double(), want, rtol=0, atol=50 * tol)
    # the PyTorch search it replaces: the same m, tau and d
    monkeypatch.setattr(native, "enabled", False)
    th = ops.threshold(kind, x, None, method="dense") if c > 1 else ops.threshold(kind, x, None, method="sort")
    torch.testing.assert_close(m, th.m, rtol=0, atol=0)
    finite_rows = torch.isfinite(x).any(1)
    torch.testing.assert_close(tau[finite_rows], th.tau[finite_rows], rtol=0, atol=10 * tol)
    torch.testing.assert_close(p, ops.dense_probs(kind, x, th), rtol=0, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("kind", KINDS)
def test_fused_loss_and_gradient_match_the_oracle(kind, reduction, dtype, tol, monkeypatch):
    """Ids with a sum / mean over rows the CPU default searches densely: the kernel's value and
    whole gradient against the float64 loop oracle and against the PyTorch path."""
    c, rows = 300, 128
    assert ops.auto_search(kind, rows, c) == ("dense", None)
    x = hard_rows(c, dtype, seed=8, rows=rows)
    x[1] = torch.randn(c, dtype=dtype)  # the loss refuses rows without a finite score (data check)
    g = torch.Generator().manual_seed(2)
    y = torch.randint(0, c, (rows,), generator=g)
    y[3] = c - 1  # a target on a kept score of a half-masked row
    fn = getattr(losses, f"{kind}_loss")
    # the oracle on shifted scores (the loss and its gradient are shift-invariant; see above)
    values, grads, _ = oracle_loss(kind, x.double() - x.double().amax(1, keepdim=True), y)
    div = rows if reduction == "mean" else 1
    xa = x.clone().requires_grad_()
    out = fn(xa, y, reduction=reduction)
    (gx,) = torch.autograd.grad(out, xa)
    assert out.dtype == dtype and gx.dtype == dtype
    torch.testing.assert_close(out.double(), values.sum() / div, rtol=tol, atol=tol)
    torch.testing.assert_close(gx.double(), grads / div, rtol=0, atol=tol)
    monkeypatch.setattr(native, "enabled", False)
    xb = x.clone().requires_grad_()
    ref = fn(xb, y, reduction=reduction)
    (gr,) = torch.autograd.grad(ref, xb)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    torch.testing.assert_close(gx, gr, rtol=0, atol=tol)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("kind", KINDS)
def test_per_row_losses_with_ignored_positions(kind, reduction, monkeypatch):
    """Ignored positions or reduction="none": the kernel's per-row values and gradients
    (p* - onehot) against the oracle and the PyTorch path, ignored rows exactly 0."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 300, 7, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 300, (6, 7), generator=g)
    y[1, 3] = y[4, 0] = -100
    fn = getattr(losses, f"{kind}_loss")
    w = torch.rand(6, 7, generator=g, dtype=torch.float64)
    results = []
    for enabled in (True, False):
        monkeypatch.setattr(native, "enabled", enabled)
        xa = x.clone().requires_grad_()
        out = fn(xa, y, reduction=reduction)
        (gx,) = torch.autograd.grad((out * w).sum() if reduction == "none" else out * 1.5, xa)
        results.append((out, gx))
    (out, gx), (ref, gref) = results
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(gx, gref, rtol=0, atol=1e-13)
    if reduction == "none":
        assert out[1, 3] == 0 and out[4, 0] == 0
        values, grads, _ = oracle_loss(kind, x, y)
        torch.testing.assert_close(out, values, rtol=0, atol=1e-12)
    assert torch.all(gx[1, :, 3] == 0) and torch.all(gx[4, :, 0] == 0)


@pytest.mark.parametrize("kind", KINDS)
def test_compiled_operator_on_wide_rows_and_handed_back_rows_matches_eager(kind):
    """The per-row operator of compiled graphs on wide rows (the kernel, where the eager default
    takes the top-k) and on a batch whose kept row holds NaN (handed back: the eager arithmetic)
    gives the eager values and gradients."""
    g = torch.Generator().manual_seed(5)
    for c, poison in ((5000, False), (300, True)):
        z = torch.randn(10, c, generator=g, dtype=torch.float64)
        y = torch.randint(0, c, (10,), generator=g)
        keep = torch.ones(10, dtype=torch.bool)
        keep[3] = False
        z[3] = float("nan")  # ignored: not read
        if poison:
            z[5, 9] = float("nan")  # kept: the kernel hands it back; the eager path gives NaN too
        values, grad = ops._FY_ROWS_OP(z, y, keep, kind)
        zz = torch.where(keep.unsqueeze(1), z, 0.0).requires_grad_(True)
        with losses.validation(False):
            ref = getattr(losses, f"{kind}_loss")(zz, torch.where(keep, y, -100), reduction="none")
        (gref,) = torch.autograd.grad(ref.nansum(), zz)
        torch.testing.assert_close(values, ref, rtol=0, atol=1e-13, equal_nan=True)
        rows = torch.isfinite(ref)
        torch.testing.assert_close(grad[rows], gref[rows], rtol=0, atol=1e-13)
        assert values[3] == 0 and torch.all(grad[3] == 0)


@pytest.mark.parametrize("kind", KINDS)
def test_target_on_a_masked_score_gives_inf_with_a_finite_gradient(kind):
    x = torch.randn(8, 300, dtype=torch.float64)
    x[0, 5] = NINF
    y = torch.zeros(8, dtype=torch.long)
    y[0] = 5
    xa = x.clone().requires_grad_()
    out = getattr(losses, f"{kind}_loss")(xa, y, reduction="sum")
    assert out.item() == float("inf")
    (gx,) = torch.autograd.grad(out, xa)
    assert torch.isfinite(gx).all()
    p = getattr(losses, kind)(x)
    torch.testing.assert_close(gx, p - torch.nn.functional.one_hot(y, 300).double(), rtol=0, atol=1e-13)


@pytest.mark.parametrize("bad", ["nan", "inf", "id"])
@pytest.mark.parametrize("kind", KINDS)
def test_cases_the_kernel_hands_back_behave_as_without_it(kind, bad, monkeypatch):
    """With the data checks off, NaN / +inf scores and an id out of range reach the kernel, which
    returns a status; the PyTorch path then runs and gives what it gives without the kernel (the
    same values, or the same error)."""
    x = torch.randn(16, 300, dtype=torch.float64)
    y = torch.randint(0, 300, (16,))
    if bad == "nan":
        x[4, 7] = float("nan")
    elif bad == "inf":
        x[4, 7] = float("inf")
    else:
        y[4] = 300
    assert native.threshold(x, kind == "entmax15") is None or bad == "id"
    assert native.fy_ids(x, y, kind == "entmax15", 16, True) is None
    fn = getattr(losses, f"{kind}_loss")

    def run():
        with losses.validation(False):
            try:
                return fn(x, y, reduction="mean"), None
            except Exception as exc:  # the torch path's own error
                return None, type(exc)

    got = run()
    monkeypatch.setattr(native, "enabled", False)
    want = run()
    assert got[1] == want[1]
    if want[0] is not None:
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)


def test_a_search_that_does_not_end_goes_back_to_torch(monkeypatch):
    x = torch.linspace(0, -1.2, 300, dtype=torch.float64).repeat(4, 1)  # several Michelot steps
    monkeypatch.setattr(native, "MAX_STEPS", 1)
    assert native.threshold(x, False) is None
    th = ops.threshold("sparsemax", x, None, method="dense")  # the PyTorch search takes over
    torch.testing.assert_close(ops.dense_probs("sparsemax", x, th), oracle_activation("sparsemax", x), rtol=0,
                               atol=1e-13)


@pytest.mark.parametrize("kind", KINDS)
def test_rows_split_over_threads_give_the_same_bits(kind):
    """Above PARALLEL_MIN scores the rows are split over torch's thread count; every row is
    computed by the same code, and the total is summed in row order afterwards."""
    g = torch.Generator().manual_seed(6)
    rows = native.PARALLEL_MIN // 1000 + 37
    x = torch.randn(rows, 1000, generator=g)
    y = torch.randint(0, 1000, (rows,), generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.fy_ids(x, y, kind == "entmax15", rows, True)
        one_th = native.threshold(x, kind == "entmax15")
        torch.set_num_threads(3)
        assert native._threads(rows, 1000) == 3
        three = native.fy_ids(x, y, kind == "entmax15", rows, True)
        three_th = native.threshold(x, kind == "entmax15")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], three[0]) and torch.equal(one[1], three[1])
    for a, b in zip(one_th, three_th):
        assert torch.equal(a, b)


def test_non_contiguous_and_class_dim_one_inputs():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 400, 5, generator=g, dtype=torch.float64)  # classes on dim 1: rows are strided
    y = torch.randint(0, 400, (6, 5), generator=g)
    for kind in KINDS:
        fn = getattr(losses, f"{kind}_loss")
        xa = x.clone().requires_grad_()
        out = fn(xa, y, reduction="sum")
        (gx,) = torch.autograd.grad(out, xa)
        values, grads, _ = oracle_loss(kind, x, y)
        torch.testing.assert_close(out, values.sum(), rtol=0, atol=1e-11)
        torch.testing.assert_close(gx, grads, rtol=0, atol=1e-12)


def _interpreter(code: str, env: dict) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=240)


def _fresh(module):
    """A new, unbuilt handle on ``module``'s kernel (the state a fresh process starts from)."""
    k = module._KERNEL
    return _native.NativeLibrary(k.stem, k.source, k.flags, k.declare)


KERNEL_MODULES = [native, dice_native, rows_native]


def test_without_a_compiler_or_when_disabled_nothing_is_built(tmp_path, monkeypatch):
    """No compiler on PATH (and none cached) or LOSSES_NATIVE=0: nothing is built and the reason is
    reported; with a compiler each kernel builds into the cache and loads. (The losses' values with
    a kernel switched off are the PyTorch path's, which every kernel test compares with.)"""
    for module in KERNEL_MODULES:
        monkeypatch.setenv("LOSSES_CACHE_DIR", str(tmp_path / "with"))
        built = _fresh(module)
        assert built.load() is not None and built.why.startswith("built with"), built.why
        monkeypatch.setenv("LOSSES_CACHE_DIR", str(tmp_path / "bare"))
        monkeypatch.setenv("PATH", "")
        monkeypatch.setenv("CC", "")
        bare = _fresh(module)
        assert bare.load() is None and bare.tried and "no C compiler" in bare.why
        assert not list((tmp_path / "bare").rglob("*.so"))
        monkeypatch.undo()
        monkeypatch.setenv("LOSSES_CACHE_DIR", str(tmp_path / "with"))
        monkeypatch.setenv("LOSSES_NATIVE", "0")
        off = _fresh(module)
        assert off.load() is None and off.why == "disabled by LOSSES_NATIVE=0"
        monkeypatch.undo()
    assert len(list((tmp_path / "with" / "kernels").glob("*.so"))) == len(KERNEL_MODULES)


def test_concurrent_builds_into_one_empty_cache(tmp_path, monkeypatch):
    """Builds that start at once (pytest -n, a DDP job: here three handles in three threads, each
    running the compiler) each write their own temporary file and rename it into place, so every
    one loads a whole library and one file is left."""
    import threading

    monkeypatch.setenv("LOSSES_CACHE_DIR", str(tmp_path))
    handles = [_fresh(native) for _ in range(3)]
    threads = [threading.Thread(target=h.load) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert all(h.lib is not None for h in handles), [h.why for h in handles]
    assert len({h.why for h in handles}) == 1
    assert len(list((tmp_path / "kernels").glob("*.so"))) == 1
    assert not [p for p in (tmp_path / "kernels").iterdir() if p.is_dir()]  # temporary folders removed
    x = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    for h in handles:  # each loaded library runs
        out = [x.amax(1, keepdim=True)] + [torch.empty(8, 1) for _ in range(5)]
        d = torch.empty_like(x)
        st = h.lib.entmax_threshold_f32(x.data_ptr(), 8, 50, 0, native.MAX_STEPS, 1, out[0].data_ptr(),
                                        out[1].data_ptr(), d.data_ptr(), *(t.data_ptr() for t in out[2:]))
        assert st == 0 and torch.allclose(d.sum(1), torch.ones(8))


def test_first_use_inside_torch_compile_builds_without_a_graph_break(tmp_path):
    """A process whose first sparse loss call is compiled (empty kernel cache): dynamo must not
    trace into the build (its lock, files and compiler run), which would break the graph; the
    build runs eagerly at trace time and fullgraph=True compiles."""
    code = """
        import torch, losses
        from losses.kernels import entmax_native as native
        assert native._KERNEL.tried is False
        g = torch.Generator().manual_seed(0)
        z = torch.randn(64, 500, generator=g, requires_grad=True)
        y = torch.randint(0, 500, (64,), generator=g)
        with losses.validation(False):
            ex = torch._dynamo.explain(losses.SparsemaxLoss())(z, y)
            assert ex.graph_break_count == 0, ex.break_reasons
            torch._dynamo.reset()
            out = torch.compile(losses.SparsemaxLoss(), fullgraph=True)(z, y)
            (g1,) = torch.autograd.grad(out, z)
            ref = losses.sparsemax_loss(z, y)
            (g2,) = torch.autograd.grad(ref, z)
        assert native.available()[0]
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
        torch.testing.assert_close(g1, g2, rtol=0, atol=1e-7)
        print("ok")
    """
    done = _interpreter(code, {"LOSSES_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_a_cxx_driver_builds_the_kernel_as_c(tmp_path, monkeypatch):
    """Where the only compiler is a C++ driver (g++: the one torch.compile's CPU backend needs),
    the source is compiled as C (``-x c``), so its symbols keep C linkage and load."""
    monkeypatch.setenv("LOSSES_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "g++")
    for module in KERNEL_MODULES:
        h = _fresh(module)
        assert h.load() is not None and h.why.startswith("built with g++"), h.why


def _compiler_wrapper(tmp_path, extra: str) -> str:
    """An executable that runs the machine's C compiler with ``extra`` before the caller's flags."""
    cc = _native.compiler()
    assert cc is not None, "these tests need a C compiler (gcc on CI)"
    path = tmp_path / "cc-wrapper"
    path.write_text(f'#!/bin/sh\nexec "{cc}" {extra} "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_a_compiler_that_fortifies_by_default_builds_every_kernel(tmp_path, monkeypatch):
    """A GCC that defines ``_FORTIFY_SOURCE`` whenever it optimises (Ubuntu's does) made ``memcpy``
    an ``always_inline`` wrapper that GCC would not inline into the AVX2 / AVX-512 copies of the
    Dice and row kernels, so they failed to build there and the PyTorch path ran. A compiler that
    defines it on every call, as that GCC does, builds and loads every kernel."""
    monkeypatch.setenv("LOSSES_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", _compiler_wrapper(tmp_path, "-O2 -D_FORTIFY_SOURCE=2"))
    for module in KERNEL_MODULES:
        h = _fresh(module)
        assert h.load() is not None and h.why.startswith("built with cc-wrapper"), h.why


def test_a_failed_build_names_its_first_error_and_keeps_the_whole_output(tmp_path, monkeypatch):
    """The reason ``native_kernels()`` shows for a kernel that did not build is the compiler's first
    error line (not the chain of included files that opens a diagnostic), and the whole output is
    kept in the cache folder, named in the message."""
    monkeypatch.setenv("LOSSES_CACHE_DIR", str(tmp_path))
    source = "#include <math.h>\n#include <string.h>\nint broken(void) { return not_declared_anywhere; }\n"
    path, why = _native.compile_library("broken", source, ["-O2", "-fPIC", "-shared"])
    assert path is None
    assert "failed:" in why and "not_declared_anywhere" in why and "error" in why, why
    log = why.rsplit("(whole output: ", 1)[1].rstrip(")")
    assert os.path.isfile(log) and "not_declared_anywhere" in open(log).read()
    assert not list((tmp_path / "kernels").glob("broken_*.so"))


def test_native_kernels_reports_the_kernel_and_why_not(monkeypatch):
    """The public view of the kernel: in use where it is built and enabled, otherwise why not; and
    a fresh interpreter with LOSSES_NATIVE=0 reports it disabled."""
    status = losses.native_kernels()
    assert set(status) == {"entmax_threshold", "dice_stats", "loss_rows", "softmax_rows", "z_loss_rows"}
    in_use, detail = status["entmax_threshold"]
    assert in_use == native.ready() and isinstance(detail, str) and detail
    if in_use:
        monkeypatch.setattr(native, "enabled", False)
        off, why = losses.native_kernels()["entmax_threshold"]
        assert off is False and "switched off" in why
    code = "import losses; print(losses.native_kernels()['entmax_threshold'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, LOSSES_NATIVE="0"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(False, 'disabled by LOSSES_NATIVE=0')"
