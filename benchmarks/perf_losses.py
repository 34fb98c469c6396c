"""Time and peak memory of every registered loss, side by side with ``F.cross_entropy`` and peers.

Timing method. The implementations compared in one case (same shapes, same input tensors) are
built in one fresh subprocess and timed **interleaved**: each repetition runs every
implementation once, in a fixed order (A B C, A B C, ...), after warm-up. Reported per
implementation: the median and the spread (interquartile range and min-max) of the per-step
times; a ratio between two implementations is the **median over repetitions of the per-repetition
ratio** (``t_A[i] / t_B[i]``), so slow phases of a shared machine hit both sides of a ratio alike.
``--clock cpu`` (the default of the ``targets`` and ``peers`` suites, which run on 1 thread) reads
``time.process_time()``: the CPU time of the process, which other jobs on a shared machine do not
inflate the way they inflate the wall clock; ``--clock wall`` reads ``time.perf_counter()``.
Peak memory: peak RSS minus the RSS after inputs and parameters are allocated (parameters
excluded, their gradients included), measured in a separate fresh subprocess per loss with a
fixed glibc mmap threshold (``MALLOC_MMAP_THRESHOLD_=131072``), so that the peak is that of live
memory and not of blocks the allocator keeps cached after freeing them.
Data checks are off (``losses.validation(False)``), as the performance targets specify.

Usage::

    python benchmarks/perf_losses.py                       # suite "losses", C in 10..1e5
    python benchmarks/perf_losses.py --suite partial_fc    # Partial FC vs margin softmax, C to 1e6
    python benchmarks/perf_losses.py --suite sparsemax     # sort vs top-k vs bisection
    python benchmarks/perf_losses.py --suite sparsemax_paths --skip-memory   # k=None vs given k, (N, C) grid
    python benchmarks/perf_losses.py --suite sparsemax_forced --skip-memory  # each exact search forced
    python benchmarks/perf_losses.py --suite linear_ce     # many-class path vs linear + CE
    python benchmarks/perf_losses.py --suite targets       # the performance targets (1 thread, cpu clock)
    python benchmarks/perf_losses.py --suite peers         # installed peer libraries on the same inputs
    python benchmarks/perf_losses.py --suite peers --small --out /tmp/p   # seconds-long smoke run
    python benchmarks/perf_losses.py --suite lm_head --max-seconds 40   # LM head, V=30,522: time, memory, agreement
    python benchmarks/perf_losses.py --suite compiled --skip-memory  # torch.compile'd losses vs compiled CE and a copy
    python benchmarks/perf_losses.py --suite opcost --out results/perf/epyc   # this machine's unit-pass costs
    python benchmarks/perf_losses.py --suite all --out results/perf

Writes ``<out>/<suite>.csv``, ``<out>/<suite>.md`` and ``<out>/<suite>.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# --------------------------------------------------------------------------------------
# worker side (runs in a fresh subprocess)
# --------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak_rss() -> None:
    """Reset the process's RSS high-water mark (Linux: ``5`` to ``/proc/self/clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _hwm_bytes() -> int:
    """The RSS high-water mark since the last :func:`_reset_peak_rss` (``VmHWM``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")  # pragma: no cover


#: inputs shared by the implementations timed in one process (same tensors, not only same values)
_SHARED: Dict = {}


def _shared(key: tuple, make):
    if key not in _SHARED:
        _SHARED[key] = make()
    return _SHARED[key]


def _logits_and_ids(b: int, c: int):
    import torch

    def make():
        g = torch.Generator().manual_seed(0)
        return torch.randn(b, c, generator=g).requires_grad_(True), torch.randint(0, c, (b,), generator=g)

    return _shared(("logits", b, c), make)


def _embeddings_and_ids(b: int, d: int, c: int):
    import torch

    def make():
        g = torch.Generator().manual_seed(0)
        return torch.randn(b, d, generator=g).requires_grad_(True), torch.randint(0, c, (b,), generator=g)

    return _shared(("embeddings", b, d, c), make)


def _build(case: Dict) -> tuple:
    """Return ``(step, tensors)``: ``step()`` runs one forward + backward; ``tensors`` hold grads."""
    import torch
    import torch.nn.functional as F

    import losses

    torch.manual_seed(0)
    b, c, d = case["B"], case["C"], case.get("D", 128)
    name = case["name"]
    g = torch.Generator().manual_seed(1)

    compiled = bool(case.get("compile"))
    if name == "F.cross_entropy":
        x, y = _logits_and_ids(b, c)
        ce = torch.compile(F.cross_entropy) if compiled else F.cross_entropy
        return (lambda: ce(x, y).backward()), {"x": x}
    if name.startswith("pass:"):  # one compiled pass reading the logits with one operation per element
        x, _ = _logits_and_ids(b, c)
        op = PASSES[name]
        fn = torch.compile(op)
        xd = x.detach()
        return (lambda: fn(xd)), {}
    if name == "F.binary_cross_entropy_with_logits":  # PyTorch's own op, the one-hot built in the graph
        x, y = _logits_and_ids(b, c)

        def bce(z, t):
            onehot = (torch.arange(z.shape[1], device=z.device) == t.unsqueeze(1)).to(z.dtype)
            return F.binary_cross_entropy_with_logits(z, onehot)

        fn = torch.compile(bce) if compiled else bce
        return (lambda: fn(x, y).backward()), {"x": x}
    if name == "copy":  # the floor of a single-pass logits loss: one read and one write of the logits
        x, _ = _logits_and_ids(b, c)
        return (lambda: x.detach().clone()), {}
    if name == "linear+F.cross_entropy":
        x, y = _embeddings_and_ids(b, d, c)
        w = (torch.randn(c, d, generator=g) * 0.01).requires_grad_(True)
        return _with_optimizer(case, lambda: F.cross_entropy(x @ w.T, y).backward(), [w]), {"x": x, "w": w}

    spec = losses.get_loss_spec(name)
    kwargs = dict(case.get("kwargs", {}))
    if spec.owns_head:
        kwargs.update(embedding_dim=d, num_classes=c)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = spec.create(**kwargs)
    if spec.kind in ("logits", "scores"):
        args = _logits_and_ids(b, c)
    elif spec.kind == "embeddings":
        args = _embeddings_and_ids(b, d, c)
    elif spec.kind == "pairs":
        pos = torch.rand(b, generator=g).mul(2).sub(1).requires_grad_(True)
        neg = torch.rand(b, c, generator=g).mul(2).sub(1).requires_grad_(True)
        args = (pos, neg)
    elif spec.kind == "model":
        model = torch.nn.Linear(d, c)
        x = torch.rand(b, d, generator=g)
        y = torch.randint(0, c, (b,), generator=g)
        args = (model, x, y)
    else:  # pragma: no cover
        raise ValueError(spec.kind)
    tensors = {f"a{i}": a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    tensors.update({n: p for n, p in module.named_parameters()})
    if spec.kind == "model":
        tensors.update({f"m.{n}": p for n, p in args[0].named_parameters()})

    force = case.get("force")
    call = torch.compile(module) if compiled else module  # compiled: inductor, compiled in the warm-up
    if force is None:
        def step():
            call(*args).backward()
    else:
        # suite "sparsemax_forced": one exact search forced: "native" (the C kernel, as the CPU default
        # takes it for rows of at most 2,048 classes, fused value and gradient included), or one of
        # the PyTorch searches with the kernel off ("dense", "newton", "sort", "topk<k>")
        from losses.kernels import entmax_native as native
        from losses.classification import _entmax_ops as ops

        original, original_auto, was = ops.threshold, ops.auto_search, native.enabled

        def forced(kind, z, k, method=None, max_iter=ops.NEWTON_MAX_ITER, **kw):
            if force.startswith("topk"):
                return ops._threshold_topk(kind, z, min(int(force[4:]), z.shape[-1]))
            return original(kind, z, None, "dense" if force == "native" else force, max_iter)

        def step():
            ops.threshold = forced
            native.enabled = force == "native"
            if force == "native":
                ops.auto_search = lambda kind, m, c, native=None: ("dense", None)
            try:
                module(*args).backward()
            finally:
                ops.threshold, ops.auto_search, native.enabled = original, original_auto, was

    return _with_optimizer(case, step, list(module.parameters())), tensors


def _with_optimizer(case: Dict, step, params):
    """``case["optimizer"]`` (``"adamw"`` or ``"sparse_adam"``): one timed step is forward, backward
    and the optimiser's update of the case's own parameters (the class centres), the cost a training
    loop pays for a head of ``C`` centres; without it, forward and backward only."""
    import torch

    opt_name = case.get("optimizer")
    if not opt_name:
        return step
    opt = (torch.optim.SparseAdam(params, lr=1e-3) if opt_name == "sparse_adam"
           else torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05))

    def with_update():
        step()
        opt.step()

    return with_update


def _clock(name: str):
    return time.process_time if name in ("cpu", "process") else time.perf_counter


def worker(case: Dict) -> Dict:
    """Peak memory of one case (``mode="memory"``), or the interleaved timing of a group."""
    import torch

    import losses

    torch.set_num_threads(case["threads"])
    if case["mode"] == "batch":  # several groups in one process, one after the other
        results = []
        for group in case["groups"]:
            _SHARED.clear()
            results.append(group_worker(group))
        return {"results": results}
    if case["mode"] == "agree":
        return agree_worker(case)
    if case["mode"] != "memory":
        return group_worker(case)
    with losses.validation(False):
        step, tensors = (_build_peer if case.get("peers") else _build)(case)
        if case.get("warm"):
            # steady state: one step first (a compiled path compiles in it), its gradients dropped,
            # then the peak of the second step over the RSS before it
            import gc

            step()
            _zero(tensors)
            gc.collect()
            base = _rss_bytes()
            _reset_peak_rss()
            step()
            peak = _hwm_bytes()
        else:
            base = _rss_bytes()
            step()
            peak = _peak_rss_bytes()
        return {"peak_mb": max(peak - base, 0) / 2**20}


def group_worker(group: Dict) -> Dict:
    """Time the implementations of ``group["cases"]`` interleaved: each repetition runs each once.

    Returns ``{"times": {label: [seconds per repetition]}, "errors": {label: message}}``; an
    implementation that fails to build or to run is dropped from the repetitions with its error.
    """
    import gc

    import losses

    builder = _build_peer if group.get("peers") else _build
    impls, errors = [], {}
    with losses.validation(False):
        for case in group["cases"]:
            try:
                step, tensors = builder(case)
                for _ in range(group["warmup"]):
                    step()
                    _zero(tensors)
            except Exception as e:  # a peer that cannot run here (no GPU, no compiler, ...)
                errors[case["label"]] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
                continue
            impls.append((case["label"], step, tensors))
        clock = _clock(group.get("clock", "wall"))
        times: Dict[str, List[float]] = {label: [] for label, _, _ in impls}
        budget = time.perf_counter() + group["max_seconds"] * max(len(impls), 1)
        gc.collect()
        gc.disable()
        try:
            for _ in range(group["repeats"]):
                for label, step, tensors in impls:
                    t0 = clock()
                    step()
                    times[label].append(clock() - t0)
                    _zero(tensors)
                if time.perf_counter() > budget and len(times[impls[0][0]] if impls else []) >= 3:
                    break
        finally:
            gc.enable()
    return {"times": times, "errors": errors}


def _zero(tensors: Dict) -> None:
    for t in tensors.values():
        t.grad = None


#: glibc settings of the timing workers. With glibc's dynamic mmap threshold, whether a freed
#: block of 1-32 MB goes back to the OS (and its pages fault in again at the next call) depends on
#: the process's allocation history: ``F.cross_entropy`` at (256, 1e3) took 468-718 minor page
#: faults per step in some worker processes (0.9-1.2 ms) and none in others (0.5 ms), a wobble of
#: the reference larger than the differences being measured. A fixed threshold of 32 MB (glibc's
#: own upper bound for the dynamic one, so blocks above it are mapped and unmapped as before) and
#: no trimming of the heap keep every implementation's steady state free of page faults below that
#: size; larger blocks (the (256, 1e5) logits) are mapped per call for every implementation alike.
TIMING_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30)}


def _run_case(case: Dict, timeout: float = 1800.0) -> Dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(case["threads"]), PYTHONPATH=ROOT)
    if case["mode"] == "memory":
        # A fixed glibc mmap threshold returns every large freed block to the OS at once, so the
        # peak RSS is the peak of live memory rather than of the allocator's cached free blocks
        # (with glibc's dynamic threshold the same run varied between 147 and 265 MB).
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    else:
        env.update(TIMING_MALLOC_ENV)
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(case)],
        capture_output=True, text=True, timeout=timeout, env=env,
    )
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": err[:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------


def _quantile(v: List[float], q: float) -> float:
    s = sorted(v)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(times: List[float]) -> Dict:
    """Median, quartiles and min-max of per-step times, in ms."""
    ms = [1e3 * t for t in times]
    return {"ms": statistics.median(ms), "q1": _quantile(ms, 0.25), "q3": _quantile(ms, 0.75),
            "min": min(ms), "max": max(ms), "n": len(ms)}


def paired_ratio(a: List[float], b: List[float]) -> Optional[Dict]:
    """Median (and quartiles) over repetitions of ``a[i] / b[i]``; ``None`` without data."""
    r = [x / y for x, y in zip(a, b) if y > 0]
    if not r:
        return None
    return {"ratio": statistics.median(r), "r_q1": _quantile(r, 0.25), "r_q3": _quantile(r, 0.75)}


# --------------------------------------------------------------------------------------
# suites
# --------------------------------------------------------------------------------------

SINGLE_PASS = ("z_loss", "logz_penalty", "comp_sum", "gol")

#: suite "compiled": one compiled pass over the logits with one operation per element (forward
#: only, reduced to a scalar so nothing is written): the unit costs of the bounds below. The cost
#: of an operation per element = its pass minus the plain read ("pass: sum(x)").
PASSES = {
    "pass: sum(x)": lambda x: x.sum(),
    "pass: sum(exp(x))": lambda x: x.exp().sum(),
    "pass: sum(log(1 + |x|))": lambda x: (x.abs() + 1.0).log().sum(),
    "pass: sum(log1p(|x|))": lambda x: x.abs().log1p().sum(),
    "pass: sum(tanh(x))": lambda x: x.tanh().sum(),
}

#: suite "compiled": (loss row, the per-element operation its maths needs that cross-entropy does
#: not, that operation's pass, why). The bound of the row is the 1.2x target plus that operation:
#: ``1.2 + (t_pass - t_read) / t_compiled_CE`` (medians of the same interleaved run).
COMPILED_BOUNDS = [
    ("bce_with_logits (compiled)", "log1p", "pass: sum(log1p(|x|))",
     "softplus(x) = max(x, 0) + log1p(exp(-|x|)) per element; cross-entropy's log is per row"),
    ("gol (compiled)", "log", "pass: sum(log(1 + |x|))",
     "-log(1 - eta) = log(1/2 + 1/(2 tanh(u/2))) per element; cross-entropy's log is per row"),
]


def suite_cases(suite: str, classes: List[int]) -> List[Dict]:
    import losses

    cases: List[Dict] = []
    if suite == "losses":
        for c in classes:
            cases.append({"name": "F.cross_entropy", "B": 256, "C": c, "kind": "ref"})
            cases.append({"name": "linear+F.cross_entropy", "B": 256, "C": c, "D": 128, "kind": "ref"})
            for spec in losses.list_losses():
                if spec.name == "partial_fc":
                    kw = {"sample_rate": 0.1, "seed": 0}
                elif spec.name == "soft_topk":
                    kw = {"k": min(5, c - 1)}
                elif spec.name == "adversarial_comp_sum":
                    kw = {"nu": 1.0}
                elif spec.name == "cosine_softmax":
                    kw = dict(spec.example_kwargs)
                    kw.pop("embedding_dim", None)
                    kw.pop("num_classes", None)
                else:
                    kw = {}
                if spec.name == "soft_topk" and c < 3:
                    continue
                cases.append({"name": spec.name, "B": 256, "C": c, "D": 128, "kind": spec.kind, "kwargs": kw})
    elif suite == "sparsemax":
        for c in classes:
            cases.append({"name": "F.cross_entropy", "B": 256, "C": c, "kind": "ref"})
            cases.append({"name": "sparsemax", "label": "sparsemax (sort)", "B": 256, "C": c, "kind": "logits",
                          "kwargs": {}})
            cases.append({"name": "sparsemax", "label": "sparsemax (top-k 100)", "B": 256, "C": c, "kind": "logits",
                          "kwargs": {"k": min(100, c)}})
            cases.append({"name": "entmax15", "label": "entmax15 (sort)", "B": 256, "C": c, "kind": "logits",
                          "kwargs": {}})
            cases.append({"name": "entmax_bisect", "label": "entmax_bisect (alpha=2)", "B": 256, "C": c,
                          "kind": "logits", "kwargs": {"alpha": 2.0}})
    elif suite == "sparsemax_paths":
        # every public path of the exact losses on the same batch: k=None and given top-k sizes
        for b in (32, 256, 1024):
            for c in classes:
                if b * c > 3e7:
                    continue
                cases.append({"name": "F.cross_entropy", "B": b, "C": c, "kind": "ref"})
                for name in ("sparsemax", "entmax15"):
                    cases.append({"name": name, "label": f"{name} (k=None)", "B": b, "C": c, "kind": "logits",
                                  "kwargs": {}})
                    for k in (8, 32, 128):
                        if k < c:
                            cases.append({"name": name, "label": f"{name} (k={k})", "B": b, "C": c,
                                          "kind": "logits", "kwargs": {"k": k}})
    elif suite == "sparsemax_forced":
        # each exact search forced, on the same batch (the measurement behind auto_search)
        for b in (32, 256, 1024):
            for c in classes:
                if b * c > 3e7:
                    continue
                for name in ("sparsemax", "entmax15"):
                    for force in ("native", "dense", "newton", "sort", "topk8", "topk32", "topk128"):
                        if force.startswith("topk") and int(force[4:]) >= c:
                            continue
                        cases.append({"name": name, "label": f"{name} ({force})", "B": b, "C": c,
                                      "kind": "logits", "kwargs": {}, "force": force})
    elif suite == "partial_fc":
        for c in classes:
            cases.append({"name": "linear+F.cross_entropy", "B": 256, "C": c, "D": 128, "kind": "ref"})
            cases.append({"name": "margin_softmax", "B": 256, "C": c, "D": 128, "kind": "embeddings", "kwargs": {}})
            for rate in (0.1, 1.0):
                cases.append({"name": "partial_fc", "label": f"partial_fc (rate {rate})", "B": 256, "C": c,
                              "D": 128, "kind": "embeddings", "kwargs": {"sample_rate": rate, "seed": 0}})
            # with the optimiser's update of the centres: dense AdamW at both rates, and the sampled
            # rows' sparse gradient with SparseAdam (only the sampled centres are updated)
            cases.append({"name": "linear+F.cross_entropy", "label": "linear+F.cross_entropy + AdamW", "B": 256,
                          "C": c, "D": 128, "kind": "ref", "optimizer": "adamw"})
            for rate in (0.1, 1.0):
                cases.append({"name": "partial_fc", "label": f"partial_fc (rate {rate}) + AdamW", "B": 256, "C": c,
                              "D": 128, "kind": "embeddings", "kwargs": {"sample_rate": rate, "seed": 0},
                              "optimizer": "adamw"})
            cases.append({"name": "partial_fc", "label": "partial_fc (rate 0.1, sparse_grad) + SparseAdam", "B": 256,
                          "C": c, "D": 128, "kind": "embeddings",
                          "kwargs": {"sample_rate": 0.1, "seed": 0, "sparse_grad": True}, "optimizer": "sparse_adam"})
    elif suite == "targets":
        # the performance targets, each next to its reference in the same run. Every loss row is
        # what a user calls: the registry's module built with its default arguments (a head loss
        # with embedding_dim / num_classes), called on (input, target) with data checks off.
        cases.append({"name": "F.cross_entropy", "B": 64, "C": 100, "kind": "ref"})
        cases.append({"name": "cross_entropy", "B": 64, "C": 100, "kind": "logits", "kwargs": {}})
        for c in (1000, 100000):
            cases.append({"name": "F.cross_entropy", "B": 256, "C": c, "kind": "ref"})
            cases.append({"name": "linear+F.cross_entropy", "B": 256, "C": c, "D": 128, "kind": "ref"})
            for name in ("cross_entropy",) + SINGLE_PASS + ("sparsemax", "entmax15"):
                cases.append({"name": name, "B": 256, "C": c, "kind": "logits", "kwargs": {}})
            cases.append({"name": "margin_softmax", "B": 256, "C": c, "D": 128, "kind": "embeddings", "kwargs": {}})
        cases.append({"name": "sparsemax", "label": "sparsemax (top-k 100)", "B": 256, "C": 100000, "kind": "logits",
                      "kwargs": {"k": 100}})
        cases.append({"name": "linear+F.cross_entropy", "B": 256, "C": 1000000, "D": 128, "kind": "ref"})
        cases.append({"name": "margin_softmax", "B": 256, "C": 1000000, "D": 128, "kind": "embeddings", "kwargs": {}})
        cases.append({"name": "partial_fc", "label": "partial_fc (rate 0.1)", "B": 256, "C": 1000000, "D": 128,
                      "kind": "embeddings", "kwargs": {"sample_rate": 0.1, "seed": 0}})
        cases.append({"name": "linear+F.cross_entropy", "B": 1024, "C": 100000, "D": 256, "kind": "ref"})
        cases.append({"name": "linear_cross_entropy", "B": 1024, "C": 100000, "D": 256, "kind": "embeddings",
                      "kwargs": {"bias": False}})
    elif suite == "compiled":
        # every single-pass logits loss under torch.compile, beside compiled F.cross_entropy and the
        # floor (a plain copy of the logits), eager F.cross_entropy for scale
        for c in classes:
            cases.append({"name": "F.cross_entropy", "B": 256, "C": c, "kind": "ref"})
            cases.append({"name": "F.cross_entropy", "label": "F.cross_entropy (compiled)", "B": 256, "C": c,
                          "kind": "ref", "compile": True})
            cases.append({"name": "copy", "label": "copy", "B": 256, "C": c, "kind": "ref"})
            cases.append({"name": "F.binary_cross_entropy_with_logits",
                          "label": "F.binary_cross_entropy_with_logits (compiled)", "B": 256, "C": c, "kind": "bound",
                          "compile": True})
            for name in PASSES:
                cases.append({"name": name, "B": 256, "C": c, "kind": "bound"})
            for name in ("cross_entropy", "bce_with_logits") + SINGLE_PASS + ("sparsemax", "entmax15"):
                cases.append({"name": name, "label": f"{name} (compiled)", "B": 256, "C": c, "kind": "logits",
                              "kwargs": {}, "compile": True})
    elif suite == "linear_ce":
        for c in classes:
            cases.append({"name": "linear+F.cross_entropy", "B": 1024, "C": c, "D": 256, "kind": "ref"})
            cases.append({"name": "linear_cross_entropy", "B": 1024, "C": c, "D": 256, "kind": "embeddings",
                          "kwargs": {"bias": False}})
    else:
        raise SystemExit(f"unknown suite {suite!r}")
    for case in cases:
        case.setdefault("label", case["name"])
    return cases


DEFAULT_CLASSES = {
    "losses": [10, 1000, 10000, 100000],
    "sparsemax": [10, 1000, 10000, 100000],
    "sparsemax_paths": [20, 100, 1000, 10000, 100000],
    "sparsemax_forced": [20, 100, 1000, 10000, 100000],
    "partial_fc": [10000, 100000, 1000000],
    "linear_ce": [10000, 100000],
    "compiled": [1000, 100000],
    "targets": [],
}


REFERENCES = {"F.cross_entropy": "x_ce", "linear+F.cross_entropy": "x_linear_ce",
              "F.cross_entropy (compiled)": "x_ce_compiled", "copy": "x_copy"}


def _group_key(case: Dict) -> tuple:
    # (B, C): the logits references (no D) are timed with the head losses of the same (B, C)
    return (case["B"], case["C"])


def run_suite(suite: str, classes: List[int], threads: int, out: str, repeats: int, max_seconds: float,
              skip_memory: bool, clock: str = "wall", only: Optional[List[str]] = None) -> List[Dict]:
    """Run one suite: cases of the same ``(B, C)`` are timed interleaved in one process.

    ``only``: keep these losses (by name) and the suite's references (``F.cross_entropy``, the
    copy, linear + CE); an unknown name is an error."""
    cases = suite_cases(suite, classes)
    if only:
        names = {c["name"] for c in cases if c["kind"] != "ref"}
        unknown = sorted(set(only) - names)
        if unknown:
            raise SystemExit(f"perf_losses: --losses names not in the {suite} suite (got {unknown}); "
                             f"choose from {sorted(names)}")
        # the bound rows (unit passes, PyTorch's own compiled BCE) come with a loss that has a bound
        bounded = any(label.split(" (")[0] in only for label, *_ in COMPILED_BOUNDS)
        cases = [c for c in cases if c["kind"] == "ref" or c["name"] in only or (c["kind"] == "bound" and bounded)]
    groups: Dict[tuple, List[Dict]] = {}
    for case in cases:
        groups.setdefault(_group_key(case), []).append(case)
    rows = []
    for key, members in groups.items():
        group = {"mode": "time", "cases": members, "threads": threads, "repeats": repeats, "warmup": 2,
                 "max_seconds": max_seconds, "clock": clock}
        res = _run_case(group)
        times = res.get("times", {})
        errors = res.get("errors", {})
        for case in members:
            label = case["label"]
            t = times.get(label)
            row = {"suite": suite, "loss": label, "B": case["B"], "C": case["C"], "D": case.get("D", ""),
                   "group": len(groups) and list(groups).index(key), "ms": None, "peak_mb": None,
                   "error": errors.get(label) or (res.get("error", "") if t is None else "")}
            if t:
                row.update(summarize(t))
                row["times"] = t
                for ref, col in REFERENCES.items():
                    if ref in times and ref != label:
                        pr = paired_ratio(t, times[ref])
                        if pr:
                            row[col] = pr["ratio"]
                            row[col + "_q1"], row[col + "_q3"] = pr["r_q1"], pr["r_q3"]
                    elif ref == label:
                        row[col] = 1.0
            if not skip_memory:
                mem = _run_case(dict(case, threads=threads, mode="memory"))
                row["peak_mb"] = mem.get("peak_mb")
                row["error"] = row["error"] or mem.get("error", "")
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "times"}), flush=True)
    # memory ratios to the references of the same shape
    for row in rows:
        for ref, col in REFERENCES.items():
            match = [r for r in rows if r["loss"] == ref and r["C"] == row["C"] and r["B"] == row["B"]]
            if match and match[0]["peak_mb"] and row["peak_mb"] is not None:
                row[col + "_mem"] = row["peak_mb"] / match[0]["peak_mb"] if match[0]["peak_mb"] > 0 else None
    os.makedirs(out, exist_ok=True)
    _write(rows, suite, out, _meta(threads, clock))
    return rows


def _meta(threads: int, clock: str) -> Dict:
    import torch

    return {"torch": torch.__version__, "threads": threads, "clock": clock, "cpu": f"{_cpu_name()} ({_cpu_flags()})",
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


CLOCK_NOTE = {
    "cpu": "CPU time of the process (`time.process_time`)",
    "process": "CPU time of the process (`time.process_time`)",
    "wall": "wall clock (`time.perf_counter`)",
}


def _cpu_name() -> str:
    """The processor's model name, read as every benchmark run records it (the worker's ``cpu_model``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:  # loaded by path (the tests) rather than run from benchmarks/
        sys.path.insert(0, here)
    from _reproduce_worker import cpu_model

    return cpu_model()


def _fmt(v, digits=2) -> str:
    if v is None or v == "":
        return ""
    return f"{v:.{digits}f}"


def _spread(r: Dict) -> str:
    if r.get("q1") is None:
        return ""
    return f"{r['q1']:.2f}-{r['q3']:.2f} ({r['min']:.2f}-{r['max']:.2f})"


def _write(rows: List[Dict], suite: str, out: str, meta: Dict) -> None:
    fields = ["suite", "loss", "B", "C", "D", "ms", "q1", "q3", "min", "max", "n", "peak_mb", "x_ce", "x_ce_q1",
              "x_ce_q3", "x_linear_ce", "x_linear_ce_q1", "x_linear_ce_q3", "x_ce_compiled", "x_ce_compiled_q1",
              "x_ce_compiled_q3", "x_copy", "x_ce_mem", "x_linear_ce_mem", "error"]
    with open(os.path.join(out, f"{suite}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    lines = [
        f"# Performance: `{suite}`",
        "",
        f"torch {meta['torch']}, Python {meta['python']}, {meta['threads']} thread(s), CPU: {meta['cpu']}, "
        f"{meta['date']}, clock: {CLOCK_NOTE.get(meta['clock'], meta['clock'])}. Forward + backward (rows ending "
        "`+ AdamW` / `+ SparseAdam` add that optimiser's update of the centres; its state is allocated at its first "
        "step: in the warm-up of the timings, inside the peak-memory measurement). "
        "The losses of one "
        "(B, C) are timed interleaved in one process (each repetition runs each loss once); ms = median, "
        "spread = interquartile range (min-max), n = repetitions. `x CE` = median over repetitions of the "
        "per-repetition ratio to `F.cross_entropy` on the same (B, C) logits; `x lin+CE` = the same ratio to a "
        "plain `x @ W.T` + `F.cross_entropy` of the same size. Peak MB = peak RSS minus RSS after allocation "
        "(fresh process per cell, glibc `MALLOC_MMAP_THRESHOLD_=131072` so freed blocks leave the RSS). "
        "Data checks off.",
        "",
        "| loss | B | C | D | ms | spread ms | n | x CE | x lin+CE | peak MB | mem x CE | mem x lin+CE | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['loss']} | {r['B']} | {r['C']:g} | {r['D']} | {_fmt(r['ms'])} | {_spread(r)} | {r.get('n', '')} | "
            f"{_fmt(r.get('x_ce'))} | {_fmt(r.get('x_linear_ce'))} | {_fmt(r['peak_mb'], 1)} | "
            f"{_fmt(r.get('x_ce_mem'))} | {_fmt(r.get('x_linear_ce_mem'))} | {r['error']} |"
        )
    if any(r.get("x_ce_compiled") is not None for r in rows):
        lines += [
            "",
            "Compiled (`torch.compile`, inductor; compilation happens in the warm-up, outside the timings): "
            "`x CE compiled` = the per-repetition ratio to compiled `F.cross_entropy` on the same logits, "
            "`x copy` = the ratio to a plain copy of the logits (`x.clone()`, one read and one write: the floor "
            "of a single-pass loss, whose forward + backward must at least read the logits and write their "
            "gradient).",
            "",
            "| loss | B | C | ms | x CE compiled | x copy |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            if r.get("x_copy") is not None or r["loss"] == "copy":
                lines.append(f"| {r['loss']} | {r['B']} | {r['C']:g} | {_fmt(r['ms'])} | "
                             f"{_fmt(r.get('x_ce_compiled'))} | {_fmt(r.get('x_copy'))} |")
    lines += _bounds_lines(rows)
    with open(os.path.join(out, f"{suite}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for label in dict.fromkeys(r["loss"] for r in rows):
        pts = [r for r in rows if r["loss"] == label and r["ms"]]
        if len(pts) < 1:
            continue
        style = "k--" if "cross_entropy" in label and label.startswith(("F.", "linear+")) else "-o"
        axes[0].plot([p["C"] for p in pts], [p["ms"] for p in pts], style, label=label, markersize=3)
        mpts = [p for p in pts if p["peak_mb"] is not None]
        if mpts:
            axes[1].plot([p["C"] for p in mpts], [max(p["peak_mb"], 1e-2) for p in mpts], style, label=label,
                         markersize=3)
    for ax, ylab in zip(axes, ("forward+backward time (ms, median)", "peak memory (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of classes C")
        ax.set_ylabel(ylab)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=6, ncol=2)
    fig.suptitle(f"{suite}: torch {meta['torch']}, {meta['threads']} thread(s), clock {meta['clock']}")
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{suite}.png"), dpi=110)
    plt.close(fig)


#: the compiled targets are set at (256, 1e5); at 1e3 a compiled call's fixed cost dominates
BOUND_CLASSES = 100000


def _find_row(rows: List[Dict], label: str, b: int, c: int) -> Optional[Dict]:
    """The row of ``label`` at ``(B, C)`` in one run's rows, or ``None``."""
    m = [r for r in rows if r["loss"] == label and r["B"] == b and r["C"] == c]
    return m[0] if m else None


def compiled_bounds(rows: List[Dict]) -> List[Dict]:
    """The bounds of :data:`COMPILED_BOUNDS` from one run's rows: per (B, C), the unit cost of the
    extra operation (its pass minus the plain read, medians, ms), the bound as a ratio to compiled
    ``F.cross_entropy`` (``1.2`` + that cost over compiled CE's median) and the row's measured ratio."""
    out = []
    for label, op, pass_label, why in COMPILED_BOUNDS:
        for r in [r for r in rows if r["loss"] == label and r.get("ms") and r["C"] == BOUND_CLASSES]:
            ce, read, unit = (_find_row(rows, n, r["B"], r["C"]) for n in ("F.cross_entropy (compiled)",
                                                                           "pass: sum(x)", pass_label))
            if not all(q and q.get("ms") for q in (ce, read, unit)) or r.get("x_ce_compiled") is None:
                continue
            cost = max(unit["ms"] - read["ms"], 0.0)
            bound = 1.2 + cost / ce["ms"]
            out.append({"loss": label, "B": r["B"], "C": r["C"], "op": op, "op_ms": cost, "ce_ms": ce["ms"],
                        "bound": bound, "ratio": r["x_ce_compiled"], "met": r["x_ce_compiled"] <= bound, "why": why})
    return out


def _bounds_lines(rows: List[Dict]) -> List[str]:
    bounds = compiled_bounds(rows)
    if not bounds:
        return []
    lines = ["", "Bounds (suite `compiled`): the 1.2x compiled-CE target plus the one operation per element a "
             "loss's maths needs that cross-entropy does not (cross-entropy needs one `exp` per element forward "
             "and one backward, its `log` is per row). The operation's cost per (B, C) is its `pass:` row "
             "minus `pass: sum(x)` (one compiled read of the logits), medians of this run; "
             "bound = 1.2 + that cost / compiled `F.cross_entropy`, at C = 1e5 (the shape of the compiled "
             "targets; at 1e3 a compiled call's fixed cost dominates).", "",
             "| loss | B | C | operation | its cost ms | compiled CE ms | bound x CE compiled | measured | verdict | why |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for bd in bounds:
        lines.append(f"| {bd['loss']} | {bd['B']} | {bd['C']:g} | {bd['op']} | {bd['op_ms']:.2f} | {bd['ce_ms']:.2f} | "
                     f"{bd['bound']:.2f} | {bd['ratio']:.2f} | {'met' if bd['met'] else 'missed'} | {bd['why']} |")
    return lines


#: (description, loss label, B, C, reference label, metric ("x" time or "mem"), bound)
TARGETS = [
    *[(f"{n} <= 1.2x F.cross_entropy at (256, 1e3)", n, 256, 1000, "F.cross_entropy", "x", 1.2)
      for n in ("z_loss", "logz_penalty", "comp_sum")],
    ("gol <= 1.5x F.cross_entropy at (256, 1e3)", "gol", 256, 1000, "F.cross_entropy", "x", 1.5),
    ("margin softmax <= 1.3x linear + CE at (256, 1e3, D=128)", "margin_softmax", 256, 1000,
     "linear+F.cross_entropy", "x", 1.3),
    ("sparsemax <= 2x F.cross_entropy at (256, 1e3)", "sparsemax", 256, 1000, "F.cross_entropy", "x", 2.0),
    ("entmax-1.5 <= 3x F.cross_entropy at (256, 1e3)", "entmax15", 256, 1000, "F.cross_entropy", "x", 3.0),
    *[(f"{n} <= 1.5x F.cross_entropy at (256, 1e5)", n, 256, 100000, "F.cross_entropy", "x", 1.5)
      for n in SINGLE_PASS],
    ("gol <= 1.2x F.cross_entropy at (256, 1e5)", "gol", 256, 100000, "F.cross_entropy", "x", 1.2),
    ("sparsemax (top-k) <= 2x F.cross_entropy at (256, 1e5)", "sparsemax (top-k 100)", 256, 100000,
     "F.cross_entropy", "x", 2.0),
    ("entmax-1.5 <= 2x F.cross_entropy at (256, 1e5)", "entmax15", 256, 100000, "F.cross_entropy", "x", 2.0),
    ("margin softmax <= 1.5x linear + CE at (256, 1e5, D=128)", "margin_softmax", 256, 100000,
     "linear+F.cross_entropy", "x", 1.5),
    ("Partial FC (0.1) <= 0.2x time of full margin softmax at C=1e6, D=128", "partial_fc (rate 0.1)", 256, 1000000,
     "margin_softmax", "x", 0.2),
    ("Partial FC (0.1) <= 0.3x peak memory of full margin softmax at C=1e6, D=128", "partial_fc (rate 0.1)", 256,
     1000000, "margin_softmax", "mem", 0.3),
    ("linear_cross_entropy <= 0.25x peak memory of linear + CE at (1024, 1e5, D=256)", "linear_cross_entropy", 1024,
     100000, "linear+F.cross_entropy", "mem", 0.25),
    ("linear_cross_entropy <= 1.5x time of linear + CE at (1024, 1e5, D=256)", "linear_cross_entropy", 1024, 100000,
     "linear+F.cross_entropy", "x", 1.5),
]


def _row_ratio(r: Dict, q: Dict, metric: str) -> Optional[float]:
    """Time: median of per-repetition ratios (both timed interleaved); memory: ratio of peaks."""
    if metric == "x":
        if r.get("times") and q.get("times") and r.get("group") == q.get("group"):
            pr = paired_ratio(r["times"], q["times"])
            return pr["ratio"] if pr else None
        return r["ms"] / q["ms"] if r.get("ms") and q.get("ms") else None
    return r["peak_mb"] / q["peak_mb"] if r.get("peak_mb") and q.get("peak_mb") else None


def write_targets(rows: List[Dict], out: str) -> None:
    """Evaluate :data:`TARGETS` on one run's rows and write ``targets_verdicts.md`` (headed by the
    machine: the CPU model and its vector extensions)."""
    lines = [f"CPU: {_cpu_name()} ({_cpu_flags()}); one run of `--suite targets` (its table: targets.md).", "",
             "| target | measured | verdict |", "|---|---|---|"]
    for desc, label, b, c, ref, metric, bound in TARGETS:
        r, q = _find_row(rows, label, b, c), _find_row(rows, ref, b, c)
        key = "ms" if metric == "x" else "peak_mb"
        ratio = _row_ratio(r, q, metric) if r and q else None
        if ratio is None:
            lines.append(f"| {desc} | not measured | — |")
            continue
        lines.append(f"| {desc} | {ratio:.2f}x ({r[key]:.1f} vs {q[key]:.1f} {'ms' if metric == 'x' else 'MB'}) | "
                     f"{'met' if ratio <= bound else 'missed'} |")
    with open(os.path.join(out, "targets_verdicts.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


# --------------------------------------------------------------------------------------
# peers: other libraries' implementations on the same inputs
# --------------------------------------------------------------------------------------

#: peer -> (import name, pip name)
PEER_PACKAGES = {
    "entmax": ("entmax", "entmax"),
    "pytorch-metric-learning": ("pytorch_metric_learning", "pytorch-metric-learning"),
    "monai": ("monai", "monai"),
    "sentence-transformers": ("sentence_transformers", "sentence-transformers"),
    "cut-cross-entropy": ("cut_cross_entropy", "cut-cross-entropy"),
}


def _build_peer(case: Dict) -> tuple:
    """``(step, tensors)`` for one implementation of the peers suite (project, peer or reference)."""
    import torch
    import torch.nn.functional as F

    import losses

    impl, shape = case["impl"], case["shape"]
    g = torch.Generator().manual_seed(1)

    if case["family"] in ("sparsemax", "arcface", "cce"):
        if case["family"] == "sparsemax":
            b, c = shape
            x, y = _logits_and_ids(b, c)
        else:
            b, c, d = shape
            x, y = _embeddings_and_ids(b, d, c)
        if impl == "F.cross_entropy":
            return (lambda: F.cross_entropy(x, y).backward()), {"x": x}
        if impl == "linear+F.cross_entropy":
            w = (torch.randn(c, d, generator=g) * 0.01).requires_grad_(True)
            return (lambda: F.cross_entropy(x @ w.T, y).backward()), {"x": x, "w": w}
        if impl.startswith("losses.sparsemax_loss") or impl.startswith("losses.entmax15_loss"):
            fn = losses.sparsemax_loss if "sparsemax" in impl else losses.entmax15_loss
            k = case.get("k")
            return (lambda: fn(x, y, k=k).backward()), {"x": x}
        if impl.startswith("entmax."):
            import entmax

            mod = (entmax.SparsemaxLoss if "Sparsemax" in impl else entmax.Entmax15Loss)(k=case.get("k"))
            return (lambda: mod(x, y).backward()), {"x": x}
        if impl in ("losses.MarginSoftmaxLoss", "losses.PartialFCLoss"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if impl == "losses.MarginSoftmaxLoss":
                    mod = losses.MarginSoftmaxLoss(embedding_dim=d, num_classes=c)
                else:
                    mod = losses.get_loss_spec("partial_fc").create(embedding_dim=d, num_classes=c,
                                                                      sample_rate=0.1, seed=0)
            return (lambda: mod(x, y).backward()), {"x": x, **dict(mod.named_parameters())}
        if impl == "pml.ArcFaceLoss":
            import math

            from pytorch_metric_learning.losses import ArcFaceLoss

            mod = ArcFaceLoss(num_classes=c, embedding_size=d, margin=math.degrees(0.5), scale=64.0)
            return (lambda: mod(x, y).backward()), {"x": x, **dict(mod.named_parameters())}
        if impl == "losses.linear_cross_entropy":
            w = (torch.randn(c, d, generator=g) * 0.01).requires_grad_(True)
            return (lambda: losses.linear_cross_entropy(x, y, w).backward()), {"x": x, "w": w}
        if impl.startswith("cce.linear_cross_entropy"):
            from cut_cross_entropy import linear_cross_entropy as cce

            w = (torch.randn(c, d, generator=g) * 0.01).requires_grad_(True)
            which = case["cce_impl"]
            return (lambda: cce(x, w, y, impl=which).backward()), {"x": x, "w": w}

    if case["family"] == "dice":
        b, c = shape[:2]
        spatial = tuple(shape[2:])

        def make():
            gg = torch.Generator().manual_seed(0)
            logits = torch.randn(*shape, generator=gg).requires_grad_(True)
            ids = torch.randint(0, c, (b,) + spatial, generator=gg)
            onehot = F.one_hot(ids, c).movedim(-1, 1).float().contiguous()
            return logits, ids, onehot

        logits, ids, onehot = _shared(("dice",) + tuple(shape), make)
        onehot_target = case["target"].startswith("one-hot")
        sigmoid = case["target"].endswith("(sigmoid)")  # per-class sigmoid (multi-label maps) on both sides
        if impl == "monai.DiceLoss":
            from monai.losses import DiceLoss

            mod = DiceLoss(softmax=not sigmoid, sigmoid=sigmoid, batch=True, to_onehot_y=not onehot_target)
            tgt = onehot if onehot_target else ids.unsqueeze(1)
            return (lambda: mod(logits, tgt).backward()), {"x": logits}
        fn = {"losses.soft_dice_loss": losses.soft_dice_loss,
              "losses.dice_semimetric_loss": losses.dice_semimetric_loss,
              "losses.jaccard_metric_loss": losses.jaccard_metric_loss}[impl]
        tgt = onehot if onehot_target else ids
        # smooth 5e-6 (2s = 1e-5) and every class active: soft Dice then equals MONAI's value
        act = "sigmoid" if sigmoid else "softmax"
        return (lambda: fn(logits, tgt, smooth=5e-6, active_classes="all", activation=act).backward()), {"x": logits}

    if case["family"] == "inbatch":
        b, d = shape

        def make():
            gg = torch.Generator().manual_seed(0)
            return (torch.randn(b, d, generator=gg).requires_grad_(True),
                    torch.randn(b, d, generator=gg).requires_grad_(True))

        q, p = _shared(("inbatch", b, d), make)
        labels = torch.arange(b)
        tensors = {"q": q, "p": p}
        if impl == "st.MultipleNegativesRankingLoss":
            from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

            mod = MultipleNegativesRankingLoss(torch.nn.Identity(), scale=20.0)
            # the loss on precomputed embeddings: the public method forward() calls after the encoder
            return (lambda: mod.compute_loss_from_embeddings([q, p], labels).backward()), tensors
        fn = losses.infonce_loss if impl == "losses.infonce_loss" else losses.decoupled_softmax_loss

        def step():
            scores = F.normalize(q, dim=1) @ F.normalize(p, dim=1).T  # cosine, as MNRL's cos_sim
            fn(scores, labels, temperature=0.05).backward()

        return step, tensors
    raise ValueError(f"unknown peers implementation {impl!r}")  # pragma: no cover


def peer_groups(small: bool) -> List[Dict]:
    """The peers suite: one group per (family, shape); ``pairs`` = (project label, peer label)."""
    groups: List[Dict] = []

    def add(family, peer, shape, impls, pairs, **extra):
        cases = []
        for impl in impls:
            case = {"family": family, "shape": list(shape), **extra}
            case.update(impl if isinstance(impl, dict) else {"impl": impl})
            case.setdefault("label", case["impl"])
            cases.append(case)
        groups.append({"family": family, "peer": peer, "shape": list(shape), "cases": cases, "pairs": pairs,
                       "what": extra.get("target", "")})

    for shape in ([(64, 500)] if small else [(256, 1000), (256, 100000)]):
        add("sparsemax", "entmax", shape, [
            "F.cross_entropy",
            {"impl": "losses.sparsemax_loss", "k": None},
            {"impl": "entmax.SparsemaxLoss", "label": "entmax.SparsemaxLoss (k=None)", "k": None},
            {"impl": "losses.entmax15_loss", "k": None},
            {"impl": "entmax.Entmax15Loss", "label": "entmax.Entmax15Loss (k=None)", "k": None},
            {"impl": "losses.entmax15_loss", "label": "losses.entmax15_loss (k=100)", "k": 100},
            {"impl": "entmax.Entmax15Loss", "label": "entmax.Entmax15Loss (k=100, its default)", "k": 100},
        ], [("losses.sparsemax_loss", "entmax.SparsemaxLoss (k=None)"),
            ("losses.entmax15_loss", "entmax.Entmax15Loss (k=None)"),
            ("losses.entmax15_loss (k=100)", "entmax.Entmax15Loss (k=100, its default)")])
    for shape in ([(64, 500, 32)] if small else [(256, 1000, 128), (256, 100000, 128)]):
        add("arcface", "pytorch-metric-learning", shape,
            ["linear+F.cross_entropy", "losses.MarginSoftmaxLoss",
             {"impl": "losses.PartialFCLoss", "label": "losses.PartialFCLoss (rate 0.1)"}, "pml.ArcFaceLoss"],
            [("losses.MarginSoftmaxLoss", "pml.ArcFaceLoss"), ("losses.PartialFCLoss (rate 0.1)", "pml.ArcFaceLoss")])
    dice_shapes = [(2, 11, 16, 16), (1, 4, 16, 16, 16)] if small else [(16, 11, 64, 64), (2, 4, 64, 64, 64)]
    for shape in dice_shapes:
        # (sigmoid: one group, informational, no target; on the 2-D maps)
        for target in ("id", "one-hot") + (("one-hot (sigmoid)",) if shape == dice_shapes[0] else ()):
            names = ["losses.soft_dice_loss", "losses.dice_semimetric_loss", "losses.jaccard_metric_loss"]
            add("dice", "monai", shape, ["monai.DiceLoss"] + names, [(n, "monai.DiceLoss") for n in names],
                target=target)
    for shape in ([(64, 64)] if small else [(256, 384), (1024, 384)]):
        add("inbatch", "sentence-transformers", shape,
            ["st.MultipleNegativesRankingLoss", "losses.infonce_loss", "losses.decoupled_softmax_loss"],
            [("losses.infonce_loss", "st.MultipleNegativesRankingLoss"),
             ("losses.decoupled_softmax_loss", "st.MultipleNegativesRankingLoss")])
    cce_impls = [{"impl": "cce.linear_cross_entropy", "label": "cce.linear_cross_entropy (impl=cce)",
                  "cce_impl": "cce", "hint": "its Triton kernels need a GPU"}]
    if not small:  # torch.compile of the other path takes ~15 s on this CPU: not in the smoke run
        cce_impls.append({"impl": "cce.linear_cross_entropy", "label": "cce.linear_cross_entropy (impl=torch_compile)",
                          "cce_impl": "torch_compile"})
    shape = (64, 500, 32) if small else (1024, 32768, 256)
    add("cce", "cut-cross-entropy", shape, ["linear+F.cross_entropy", "losses.linear_cross_entropy"] + cce_impls,
        [("losses.linear_cross_entropy", c["label"]) for c in cce_impls])
    return groups


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


#: peer-suite targets: (description, family, shape, what, project label, peer label, bound)
PEER_TARGETS = [
    (f"{name} <= 1.0x MONAI DiceLoss, {what} targets, {'x'.join(map(str, shape))}", "dice", list(shape), what,
     f"losses.{name}", "monai.DiceLoss", 1.0)
    for shape in ((16, 11, 64, 64), (2, 4, 64, 64, 64)) for what in ("id", "one-hot")
    for name in ("soft_dice_loss", "dice_semimetric_loss", "jaccard_metric_loss")
]


def run_peers(out: str, threads: int, repeats: int, max_seconds: float, clock: str, small: bool,
              families: Optional[List[str]] = None) -> List[Dict]:
    """Time the project's losses beside installed peers on the same inputs, interleaved per group."""
    rows: List[Dict] = []
    skipped: List[str] = []
    groups = [g for g in peer_groups(small) if not families or g["family"] in families]
    jobs = []
    for group in groups:
        peer = group["peer"]
        shape = "x".join(map(str, group["shape"]))
        if not _installed(PEER_PACKAGES[peer][0]):
            line = f"skipped: {peer} not installed (pip install {PEER_PACKAGES[peer][1]})"
            if line not in skipped:
                print(line, flush=True)
                skipped.append(line)
            peer_labels = {p for _, p in group["pairs"]}
            group["run"] = [c for c in group["cases"] if c["label"] not in peer_labels]
        else:
            group["run"] = group["cases"]
        jobs.append({"mode": "time", "peers": True, "cases": group["run"], "threads": threads, "repeats": repeats,
                     "warmup": 1 if small else 2, "max_seconds": max_seconds, "clock": clock})
    # one fresh process per family (one for the whole smoke run), its groups one after the other
    order = list(dict.fromkeys(g["family"] for g in groups))
    results: List[Dict] = [{} for _ in groups]
    for fam in (["*"] if small else order):
        idx = [i for i, g in enumerate(groups) if fam in ("*", g["family"])]
        res = _run_case({"mode": "batch", "threads": threads, "groups": [jobs[i] for i in idx]})
        for j, i in enumerate(idx):
            results[i] = res["results"][j] if "results" in res else {"error": res.get("error", "worker failed")}
    for group, res in zip(groups, results):
        peer, cases = group["peer"], group["run"]
        shape = "x".join(map(str, group["shape"]))
        what = f", {group['what']} targets" if group["what"] else ""
        times, errors = res.get("times", {}), res.get("errors", {})
        vs = {a: b for a, b in group["pairs"]}
        for case in group["cases"]:
            label = case["label"]
            side = ("project" if label.startswith("losses.") else
                    "reference" if label in ("F.cross_entropy", "linear+F.cross_entropy") else "peer")
            row = {"suite": "peers", "family": group["family"], "peer": peer, "shape": shape,
                   "target": group["what"], "side": side, "impl": label, "vs": vs.get(label, ""), "ms": None, "note": ""}
            if case not in cases:
                row["note"] = f"skipped: {peer} not installed"
            elif label in times and times[label]:
                row.update(summarize(times[label]))
                row["times"] = times[label]
                if label in vs and vs[label] in times and times[vs[label]]:
                    pr = paired_ratio(times[label], times[vs[label]])
                    if pr:
                        row.update(pr)
            else:
                row["note"] = "skipped: " + (case.get("hint", "") + " - " if case.get("hint") else "") + (
                    errors.get(label) or res.get("error") or "did not run")
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "times"}) + what, flush=True)
    os.makedirs(out, exist_ok=True)
    _write_peers(rows, skipped, out, _meta(threads, clock), small)
    return rows


def _write_peers(rows: List[Dict], skipped: List[str], out: str, meta: Dict, small: bool) -> None:
    fields = ["suite", "family", "peer", "shape", "target", "side", "impl", "vs", "ms", "q1", "q3", "min", "max", "n",
              "ratio", "r_q1", "r_q3", "note"]
    with open(os.path.join(out, "peers.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    lines = [
        "# Performance: `peers`" + (" (--small smoke sizes)" if small else ""),
        "",
        f"torch {meta['torch']}, Python {meta['python']}, {meta['threads']} thread(s), CPU: {meta['cpu']}, "
        f"{meta['date']}, clock: {CLOCK_NOTE.get(meta['clock'], meta['clock'])}. Forward + backward, float32, data "
        "checks off. The implementations of one row group share the same input tensors and are timed "
        "interleaved in one process; ms = median, spread = interquartile range (min-max), n = repetitions; "
        "`ratio` = median over repetitions of the per-repetition time ratio project / peer (IQR of the ratios "
        "in brackets); below 1 the project is faster.",
        "",
    ]
    for line in skipped:
        lines.append(f"- {line}")
    if skipped:
        lines.append("")
    lines += ["| family | shape | targets | implementation | ms | spread ms | n | vs | ratio | note |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio']:.2f} [{r['r_q1']:.2f}-{r['r_q3']:.2f}]" if r.get("ratio") is not None else ""
        lines.append(f"| {r['family']} | {r['shape']} | {r['target']} | {r['impl']} | {_fmt(r.get('ms'))} | "
                     f"{_spread(r)} | {r.get('n', '')} | {r['vs']} | {ratio} | {r['note']} |")
    if not small:
        lines += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
        for desc, family, shape, what, mine, peer, bound in PEER_TARGETS:
            sh = "x".join(map(str, shape))
            m = [r for r in rows if r["family"] == family and r["shape"] == sh and r["target"] == what
                 and r["impl"] == mine and r["vs"] == peer and r.get("ratio") is not None]
            if not m:
                lines.append(f"| {desc} | not measured | — |")
                continue
            q = [r for r in rows if r["family"] == family and r["shape"] == sh and r["target"] == what
                 and r["impl"] == peer][0]
            lines.append(f"| {desc} | {m[0]['ratio']:.2f}x ({m[0]['ms']:.1f} vs {q['ms']:.1f} ms) | "
                         f"{'met' if m[0]['ratio'] <= bound else 'missed'} |")
    with open(os.path.join(out, "peers.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional
        return
    pts = [r for r in rows if r.get("ratio") is not None]
    if not pts:
        return
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(pts) + 1.5))
    labels = [f"{r['impl'].replace('losses.', '')} vs {r['vs']} | {r['shape']} {r['target']}" for r in pts]
    ys = list(range(len(pts)))
    med = [r["ratio"] for r in pts]
    err = [[r["ratio"] - r["r_q1"] for r in pts], [r["r_q3"] - r["ratio"] for r in pts]]
    ax.barh(ys, med, xerr=err, color=["tab:green" if m <= 1 else "tab:red" for m in med], alpha=0.7)
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("time ratio project / peer (median of per-repetition ratios, IQR bars)\n< 1: project faster")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.suptitle(f"peers: torch {meta['torch']}, {meta['threads']} thread(s), clock {meta['clock']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "peers.png"), dpi=110, bbox_inches="tight")  # long labels: nothing clipped
    plt.close(fig)


# --------------------------------------------------------------------------------------
# lm_head: the language-model head (vocabulary 30,522) - time, peak memory and agreement
# --------------------------------------------------------------------------------------

#: (B tokens, C vocabulary, D hidden): MiniLM's WordPiece vocabulary, 4,096 tokens per step
LM_HEAD_SHAPE = (4096, 30522, 256)
LM_HEAD_SMALL_SHAPE = (256, 2000, 32)
#: float32 agreement with a float64 linear + CE: |loss error| / |loss| and, per gradient,
#: max |error| / max |float64 gradient|
LM_HEAD_TOL = {"loss": 1e-5, "grad": 1e-4}
LM_HEAD_REF = "linear+F.cross_entropy"


def lm_head_cases(small: bool) -> List[Dict]:
    """The implementations of suite ``lm_head``: reference, the project's path, cut-cross-entropy."""
    shape = list(LM_HEAD_SMALL_SHAPE if small else LM_HEAD_SHAPE)
    impls = [{"impl": LM_HEAD_REF}, {"impl": "losses.linear_cross_entropy"},
             {"impl": "cce.linear_cross_entropy", "label": "cce.linear_cross_entropy (impl=cce)", "cce_impl": "cce",
              "hint": "its Triton kernels need a GPU"}]
    if not small:  # torch.compile of its CPU path takes ~15 s: not in the smoke run
        impls.append({"impl": "cce.linear_cross_entropy", "label": "cce.linear_cross_entropy (impl=torch_compile)",
                      "cce_impl": "torch_compile"})
    cases = []
    for impl in impls:
        case = {"family": "cce", "peer": "cut-cross-entropy", "shape": shape, **impl}
        case.setdefault("label", case["impl"])
        cases.append(case)
    return cases


def _lm_head_fn(case: Dict):
    import torch.nn.functional as F

    import losses

    impl = case["impl"]
    if impl == LM_HEAD_REF:
        return lambda x, w, y: F.cross_entropy(x @ w.T, y)
    if impl == "losses.linear_cross_entropy":
        return lambda x, w, y: losses.linear_cross_entropy(x, y, w)
    from cut_cross_entropy import linear_cross_entropy as cce

    return lambda x, w, y: cce(x, w, y, impl=case["cce_impl"])


def agree_worker(case: Dict) -> Dict:
    """Loss and gradients of each implementation against float64 ``x @ W.T`` + ``F.cross_entropy``.

    Inputs: ``x ~ N(0, 1)`` of shape (B, D), ``W ~ N(0, 9 / D)`` (logits of sd about 3, so the
    softmax is far from uniform), uniform targets; seed 0. Per implementation: the float32 loss, its
    error relative to the float64 loss, and per gradient (x and W) the largest absolute error over
    the largest absolute float64 gradient."""
    import torch
    import torch.nn.functional as F

    import losses

    b, c, d = case["shape"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, d, generator=g)
    w = torch.randn(c, d, generator=g) * (3.0 / d ** 0.5)
    y = torch.randint(0, c, (b,), generator=g)
    x64, w64 = x.double().requires_grad_(True), w.double().requires_grad_(True)
    ref = F.cross_entropy(x64 @ w64.T, y)
    ref.backward()
    out: Dict = {}
    with losses.validation(False):
        for impl in case["cases"]:
            xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
            try:
                loss = _lm_head_fn(impl)(xi, wi, y)
                loss.backward()
            except Exception as e:  # a peer that cannot run here
                out[impl["label"]] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]}
                continue

            def rel(a, r):
                return float((a.double() - r).abs().max() / r.abs().max())

            out[impl["label"]] = {"loss": float(loss), "loss_err": abs(float(loss) - float(ref)) / abs(float(ref)),
                                  "grad_x_err": rel(xi.grad, x64.grad), "grad_w_err": rel(wi.grad, w64.grad)}
    return {"ref_loss": float(ref), "agree": out}


def run_lm_head(out: str, threads: int, repeats: int, max_seconds: float, clock: str, small: bool,
                skip_memory: bool = False) -> List[Dict]:
    """Suite ``lm_head``: linear + CE, ``losses.linear_cross_entropy`` and cut-cross-entropy at
    (tokens, vocabulary, hidden) = :data:`LM_HEAD_SHAPE`: interleaved time, the peak memory of a
    steady-state step (fresh process per implementation) and the float32 agreement."""
    cases = lm_head_cases(small)
    skipped = []
    peer, (module, pip_name) = "cut-cross-entropy", PEER_PACKAGES["cut-cross-entropy"]
    if not _installed(module):
        skipped.append(f"skipped: {peer} not installed (pip install {pip_name})")
        print(skipped[-1], flush=True)
    run = [c for c in cases if not (skipped and c["impl"].startswith("cce."))]
    b, c, d = cases[0]["shape"]
    timing = _run_case({"mode": "time", "peers": True, "cases": run, "threads": threads, "repeats": repeats,
                        "warmup": 1 if small else 2, "max_seconds": max_seconds, "clock": clock})
    agree = _run_case({"mode": "agree", "threads": threads, "shape": [b, c, d], "cases": run})
    times, errors = timing.get("times", {}), timing.get("errors", {})
    rows = []
    for case in cases:
        label = case["label"]
        side = "reference" if label == LM_HEAD_REF else "project" if label.startswith("losses.") else "peer"
        row = {"suite": "lm_head", "impl": label, "side": side, "B": b, "C": c, "D": d, "ms": None,
               "peak_mb": None, "note": ""}
        if case not in run:
            row["note"] = f"skipped: {peer} not installed"
            rows.append(row)
            continue
        if times.get(label):
            row.update(summarize(times[label]))
            row["times"] = times[label]
            if label != LM_HEAD_REF and times.get(LM_HEAD_REF):
                pr = paired_ratio(times[label], times[LM_HEAD_REF])
                if pr:
                    row.update(x_linear_ce=pr["ratio"], x_linear_ce_q1=pr["r_q1"], x_linear_ce_q3=pr["r_q3"])
        else:
            row["note"] = "skipped: " + (case.get("hint", "") + " - " if case.get("hint") else "") + (
                errors.get(label) or timing.get("error") or "did not run")
        a = agree.get("agree", {}).get(label, {})
        if "loss" in a:
            row.update(a)
            row["agrees"] = a["loss_err"] <= LM_HEAD_TOL["loss"] and max(a["grad_x_err"], a["grad_w_err"]) <= \
                LM_HEAD_TOL["grad"]
        if row["ms"] is not None and not skip_memory:
            mem = _run_case(dict(case, mode="memory", peers=True, warm=True, threads=threads))
            row["peak_mb"] = mem.get("peak_mb")
            if mem.get("error"):
                row["note"] = (row["note"] + " " if row["note"] else "") + "memory: " + mem["error"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "times"}), flush=True)
    ref = [r for r in rows if r["impl"] == LM_HEAD_REF and r.get("peak_mb")]
    for r in rows:
        if ref and r.get("peak_mb") is not None:
            r["x_linear_ce_mem"] = r["peak_mb"] / ref[0]["peak_mb"]
    os.makedirs(out, exist_ok=True)
    _write_lm_head(rows, skipped, out, _meta(threads, clock), small, agree.get("ref_loss"))
    return rows


def _write_lm_head(rows: List[Dict], skipped: List[str], out: str, meta: Dict, small: bool,
                   ref_loss: Optional[float]) -> None:
    fields = ["suite", "impl", "side", "B", "C", "D", "ms", "q1", "q3", "min", "max", "n", "x_linear_ce",
              "x_linear_ce_q1", "x_linear_ce_q3", "peak_mb", "x_linear_ce_mem", "loss", "loss_err", "grad_x_err",
              "grad_w_err", "agrees", "note"]
    with open(os.path.join(out, "lm_head.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    b, c, d = rows[0]["B"], rows[0]["C"], rows[0]["D"]

    def sci(v):
        return "" if v is None else f"{v:.1e}"

    lines = [
        "# Performance: `lm_head`" + (" (--small smoke sizes)" if small else ""),
        "",
        f"torch {meta['torch']}, Python {meta['python']}, {meta['threads']} thread(s), CPU: {meta['cpu']}, "
        f"{meta['date']}, clock: {CLOCK_NOTE.get(meta['clock'], meta['clock'])}. A language-model head: "
        f"{b:,} tokens of hidden size {d} against a vocabulary of {c:,}, float32, forward + backward "
        "(gradients of the hidden states and of the output weight), data checks off. The implementations "
        "are timed interleaved in one process (ms = median, spread = interquartile range (min-max), "
        "n = repetitions; `x lin+CE` = median of the per-repetition ratio to `x @ W.T` + `F.cross_entropy`). "
        "Peak MB = peak RSS of a steady-state step minus the RSS before it, in a fresh process per "
        "implementation (one step first - a compiled path compiles there - then the RSS high-water mark "
        "is reset and the second step measured; glibc `MALLOC_MMAP_THRESHOLD_=131072`).",
        "",
    ]
    lines += [f"- {line}" for line in skipped] + ([""] if skipped else [])
    lines += ["| implementation | ms | spread ms | n | x lin+CE | peak MB | mem x lin+CE | note |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = (f"{r['x_linear_ce']:.2f} [{r['x_linear_ce_q1']:.2f}-{r['x_linear_ce_q3']:.2f}]"
                 if r.get("x_linear_ce") is not None else "")
        lines.append(f"| {r['impl']} | {_fmt(r.get('ms'))} | {_spread(r)} | {r.get('n', '')} | {ratio} | "
                     f"{_fmt(r.get('peak_mb'), 1)} | {_fmt(r.get('x_linear_ce_mem'))} | {r['note']} |")
    lines += [
        "",
        "## Agreement",
        "",
        f"Separate inputs with logits of sd about 3 (x ~ N(0, 1), W ~ N(0, 9/D)), compared with a float64 "
        f"`x @ W.T` + `F.cross_entropy` (loss {ref_loss if ref_loss is None else f'{ref_loss:.6f}'}): "
        "loss error relative to the float64 loss; gradient error = max |error| / max |float64 gradient|. "
        f"Agrees: loss error <= {LM_HEAD_TOL['loss']:g} and both gradient errors <= {LM_HEAD_TOL['grad']:g} "
        "(float32 tolerance).",
        "",
        "| implementation | loss | loss error | grad x error | grad W error | agrees |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("loss") is None:
            continue
        lines.append(f"| {r['impl']} | {r['loss']:.6f} | {sci(r['loss_err'])} | {sci(r['grad_x_err'])} | "
                     f"{sci(r['grad_w_err'])} | {'yes' if r['agrees'] else 'no'} |")
    with open(os.path.join(out, "lm_head.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _cpu_flags() -> str:
    """The vector extensions of this CPU that matter to the kernels (from ``/proc/cpuinfo``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    keep = ["avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "avx2", "fma", "sse2"]
                    return " ".join(k for k in keep if k in have) or "none of " + ", ".join(keep)
    except OSError:
        pass
    return "unknown"


def opcost_ops() -> List[Tuple[str, Callable[[], Any]]]:
    """The unit passes of the operator-cost table: ``(name, thunk)`` over 256,000 float32 elements,
    shaped (256, 1000) (the targets' small size)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 1000, generator=g)
    pos = x.abs() + 0.5
    y = torch.randint(0, 1000, (256,), generator=g)
    xg = x.clone().requires_grad_(True)

    def ce_step():
        loss = F.cross_entropy(xg, y)
        loss.backward()
        xg.grad = None

    ops: List[Tuple[str, Callable[[], Any]]] = [
        ("copy (x.clone())", x.clone),
        ("x * 2 + 1", lambda: x * 2 + 1),
        ("torch.exp", lambda: torch.exp(x)),
        ("torch.log (positive)", lambda: torch.log(pos)),
        ("torch.log1p (positive)", lambda: torch.log1p(pos)),
        ("torch.expm1", lambda: torch.expm1(x)),
        ("torch.tanh", lambda: torch.tanh(x)),
        ("torch.sigmoid", lambda: torch.sigmoid(x)),
        ("F.softplus", lambda: F.softplus(x)),
        ("torch.sqrt (positive)", lambda: torch.sqrt(pos)),
        ("row max (x.amax(1))", lambda: x.amax(1)),
        ("row logsumexp", lambda: torch.logsumexp(x, 1)),
        ("F.log_softmax", lambda: F.log_softmax(x, 1)),
        ("F.cross_entropy, forward + backward", ce_step),
    ]
    try:
        from losses.kernels import rows_native

        if rows_native.ready():
            ops += [("the C kernels' exp (rows_native)", lambda: rows_native.unary("exp", x)),
                    ("the C kernels' log (rows_native, positive)", lambda: rows_native.unary("log", pos))]
    except Exception:  # noqa: BLE001 - no compiler: the table has torch's operators only
        pass
    return ops


def run_opcost(out: str, repeats: int) -> List[Dict]:
    """The operator-cost table of this machine: each unit pass timed with the process's CPU time on
    one thread, the passes interleaved, ``repeats`` rounds after one warm-up round; written to
    ``<out>/opcost.md`` and ``opcost.csv`` with the CPU model and its vector extensions, so that a
    bound argument ("this loss needs one transcendental more than cross-entropy") is made with this
    processor's costs."""
    import torch

    torch.set_num_threads(1)
    ops = opcost_ops()
    times: Dict[str, List[float]] = {name: [] for name, _ in ops}
    for rnd in range(repeats + 1):
        for name, fn in ops:
            t0 = time.process_time()
            for _ in range(10):
                fn()
            dt = (time.process_time() - t0) / 10
            if rnd:
                times[name].append(dt * 1e3)
    med = {name: statistics.median(v) for name, v in times.items()}
    ce = med["F.cross_entropy, forward + backward"]
    copy = med["copy (x.clone())"]
    rows = [{"op": name, "ms": med[name], "x_ce": med[name] / ce, "x_copy": med[name] / copy} for name, _ in ops]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "opcost.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["op", "ms", "x_ce", "x_copy"])
        w.writeheader()
        w.writerows(rows)
    lines = [
        "# Operator costs on this machine",
        "",
        f"`python benchmarks/perf_losses.py --suite opcost` on {_cpu_name()} ({_cpu_flags()}), torch "
        f"{torch.__version__}, one thread, CPU time of the process, {repeats} interleaved rounds of 10 calls "
        "each after a warm-up round (medians). Every pass is over 256,000 float32 elements, shaped (256, 1000), "
        "the targets' small size.",
        "",
        "| unit pass | ms | x `F.cross_entropy` (forward + backward) | x copy |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['op']} | {r['ms']:.3f} | {r['x_ce']:.2f} | {r['x_copy']:.1f} |")
    with open(os.path.join(out, "opcost.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return rows


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--suite", default="losses",
                   choices=["losses", "sparsemax", "sparsemax_paths", "sparsemax_forced", "partial_fc", "linear_ce",
                            "targets", "peers", "lm_head", "compiled", "opcost", "all"])
    p.add_argument("--classes", type=lambda s: [int(float(v)) for v in s.split(",")], default=None,
                   help="comma-separated class counts (default per suite)")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads (default: 1 for the targets and peers suites, else all cores)")
    p.add_argument("--repeats", type=int, default=None, help="repetitions (default 20; 3 with --small)")
    p.add_argument("--max-seconds", type=float, default=10.0,
                   help="time budget per implementation of a group (at least 3 repetitions run)")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--clock", choices=["wall", "cpu", "process"], default=None,
                   help="cpu: CPU time of the process (time.process_time; robust on a shared machine with "
                        "--threads 1; the default of the targets and peers suites); wall: perf_counter "
                        "(default of the other suites); process: alias of cpu")
    p.add_argument("--small", action="store_true",
                   help="peers and lm_head suites: tiny shapes, a seconds-long smoke run")
    p.add_argument("--families", type=lambda s: s.split(","), default=None,
                   help="peers suite: comma-separated subset of sparsemax,arcface,dice,inbatch,cce")
    p.add_argument("--losses", type=lambda s: s.split(","), default=None,
                   help="suites other than peers: comma-separated subset of the suite's losses (its "
                        "references always run), e.g. --suite compiled --losses z_loss,sparsemax")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "perf"))
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    suites = ["losses", "sparsemax", "partial_fc", "linear_ce", "targets", "peers"] if args.suite == "all" \
        else [args.suite]
    for suite in suites:
        if suite == "opcost":
            run_opcost(args.out, args.repeats or (3 if args.small else 20))
            continue
        pinned = suite in ("targets", "peers", "lm_head", "sparsemax_paths", "sparsemax_forced", "compiled")
        threads = args.threads or (1 if pinned else (os.cpu_count() or 1))
        clock = "cpu" if args.clock == "process" else (args.clock or ("cpu" if pinned else "wall"))
        repeats = args.repeats or (3 if args.small else 20)
        if clock == "cpu" and threads > 1:
            print(f"note: --clock cpu with {threads} threads sums the CPU time of all threads", flush=True)
        if suite == "lm_head":
            run_lm_head(args.out, threads, repeats, 0.5 if args.small else args.max_seconds, clock, args.small,
                        args.skip_memory)
            continue
        if suite == "peers":
            run_peers(args.out, threads, repeats, 0.5 if args.small else args.max_seconds, clock, args.small,
                      args.families)
            continue
        rows = run_suite(suite, args.classes or DEFAULT_CLASSES[suite], threads, args.out, repeats,
                         args.max_seconds, args.skip_memory, clock, args.losses)
        if suite == "targets":
            write_targets(rows, args.out)


if __name__ == "__main__":
    main()
