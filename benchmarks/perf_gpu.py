"""Side-by-side GPU timings of the library's kernels and their peers, in one run.

Groups (``--groups``, default the first three):

* ``logits``: forward + backward of every logits loss on language-model-sized logits
  (default ``8192x128256``, fp32 and bf16) beside ``F.cross_entropy``, a device copy of the logits
  (the bandwidth floor: one read and one write) and Liger-Kernel's cross-entropy (plain, and with
  ``lse_square_scale=1e-4``, its log-Z penalty), where ``liger_kernel`` imports.
* ``lm_head``: ``linear_cross_entropy`` (hidden states and the head's weight in, the loss and
  both gradients out) beside the naive ``x @ W.T`` + ``F.cross_entropy`` in bf16, Liger-Kernel's
  fused linear cross-entropy and cut-cross-entropy (exact, and with its default gradient filter),
  at ``N x H x V`` = ``8192x4096x128256`` and ``16384x2048x32000``.
* ``sparse``: the sparsemax and 1.5-entmax losses beside the ``entmax`` package's losses and
  ``F.cross_entropy`` at ``4096x32000`` and ``16384x1000``, fp32 and bf16.
* ``configs`` (tuning, not by default): the cross-entropy row kernel at several ``(BLOCK,
  num_warps)`` beside the built-in choice.

Method. Every case gets fresh inputs from an untimed setup (a clone of the logits that requires
grad, so a peer that overwrites its input with the gradient, as Liger's cross-entropy does, gets
new logits every repetition), then one timed call: the loss and its ``backward()``, between CUDA
events. Cases are interleaved (each repetition runs every case once) with data checks off
(``losses.validation(False)``); each row reports the median milliseconds and quartiles, and the
medians of the per-repetition ratios to the group's anchors. Before timing, each case's loss value
is checked against a reference (the library's PyTorch path, ``LOSSES_TRITON=0``, for the library's
losses; ``F.cross_entropy`` / the PyTorch path for the peers): ``rel_err``. Peak extra memory: in a
separate untimed call, the peak allocated during the call minus what was allocated before it (the
setup's inputs excluded; the gradient buffers included).

    python benchmarks/perf_gpu.py --out results/perf/gpu            # on a GPU: all groups
    python benchmarks/perf_gpu.py --device cpu --small --out /tmp/g  # the harness on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (ROOT, HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from perf_losses import _quantile, paired_ratio  # noqa: E402

GROUPS = ("logits", "lm_head", "sparse", "configs")
COLUMNS = ["group", "dtype", "shape", "case", "ms", "q1", "q3", "n", "x_ref", "x_floor", "peak_extra_mb",
           "beyond_grads_mb", "rel_err", "error"]

#: (group, ((shape, dtypes), ...)) at full size and with --small (the harness on a CPU)
SIZES = {
    "logits": ([((8192, 128256), ("bf16", "fp32"))], [((16, 300), ("bf16", "fp32"))]),
    "lm_head": ([((8192, 4096, 128256), ("bf16",)), ((16384, 2048, 32000), ("bf16",))],
                [((32, 16, 300), ("bf16",))]),
    "sparse": ([((4096, 32000), ("fp32", "bf16")), ((16384, 1000), ("fp32", "bf16"))],
               [((16, 300), ("fp32",))]),
    "configs": ([((8192, 128256), ("bf16", "fp32")), ((256, 100000), ("fp32",))], [((16, 300), ("fp32",))]),
}
#: group "configs": the row kernels' (BLOCK, num_warps) tried on cross-entropy (default: the heuristic)
CONFIGS = ((4096, 8), (8192, 8), (8192, 16), (16384, 16), (16384, 32))
#: each group's anchors: the ratio columns x_ref and x_floor
ANCHORS = {"logits": ("F.cross_entropy", "copy"), "lm_head": ("naive bf16", None),
           "sparse": ("F.cross_entropy", None), "configs": ("heuristic", None)}


@contextlib.contextmanager
def pytorch_path():
    """The library's PyTorch path for the calls inside (``LOSSES_TRITON=0``)."""
    before = os.environ.get("LOSSES_TRITON")
    os.environ["LOSSES_TRITON"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LOSSES_TRITON", None)
        else:
            os.environ["LOSSES_TRITON"] = before


def _peer(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except Exception:  # not installed (the peers are optional wheels beside the benchmark)
        return None


class Case:
    """``setup() -> args`` (untimed), ``run(*args) -> loss`` (timed with its backward unless
    ``backward`` is False), ``reference() -> float`` (the value the loss must have) or None."""

    def __init__(self, name: str, setup: Callable, run: Callable, reference: Optional[Callable] = None,
                 backward: bool = True):
        self.name, self.setup, self.run, self.reference, self.backward = name, setup, run, reference, backward

    def call(self, args) -> Optional[float]:
        out = self.run(*args)
        if self.backward:
            out.backward()
        return out


def _logit_inputs(b: int, c: int, dtype, device):
    """``(base, target, fresh)``: seeded logits ``(b, c)`` (scale 3) and ids on ``device``, and the
    setup that hands each call a fresh leaf copy of the logits."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    base = (torch.randn(b, c, generator=g, device=device) * 3).to(dtype).requires_grad_(True)
    t = torch.randint(0, c, (b,), generator=g, device=device)

    def fresh():
        base.grad = None
        return (base.detach().clone().requires_grad_(True),)

    return base, t, fresh


def _logits_cases(shape, dtype, device) -> List[Case]:
    import torch
    import torch.nn.functional as F

    import losses

    b, c = shape
    g = torch.Generator(device=device).manual_seed(0)
    base = (torch.randn(b, c, generator=g, device=device) * 3).to(dtype).requires_grad_(True)
    t = torch.randint(0, c, (b,), generator=g, device=device)
    prior = torch.full((c,), 1.0 / c, device=device)
    counts = torch.arange(1, c + 1, device=device, dtype=torch.float32)

    def fresh():
        base.grad = None
        return (base.detach().clone().requires_grad_(True),)

    ref_ce = lambda: float(F.cross_entropy(base.detach().float(), t))  # noqa: E731
    cases = [Case("copy", fresh, lambda x: x.detach().clone(), backward=False),
             Case("F.cross_entropy", fresh, lambda x: F.cross_entropy(x, t), ref_ce)]

    def ours(name, fn):
        def ref():
            with pytorch_path():
                return float(fn(base.detach()))
        cases.append(Case(name, fresh, fn, ref))

    ours("cross_entropy", lambda x: losses.cross_entropy_loss(x, t))
    ours("cross_entropy inplace", lambda x: losses.cross_entropy_loss(x, t, inplace_backward=True))
    ours("logz_penalty 1e-4", lambda x: losses.cross_entropy_with_logz_penalty(x, t, coef=1e-4))
    ours("logz_penalty 1e-4 inplace",
         lambda x: losses.cross_entropy_with_logz_penalty(x, t, coef=1e-4, inplace_backward=True))
    ours("z_loss", lambda x: losses.z_loss(x, t))
    ours("logit_adjusted", lambda x: losses.logit_adjusted_loss(x, t, prior))
    ours("balanced_softmax", lambda x: losses.balanced_softmax_loss(x, t, counts))
    ours("comp_sum", lambda x: losses.comp_sum_loss(x, t))
    ours("focal", lambda x: losses.focal_loss(x, t))
    ours("gol", lambda x: losses.gumbel_bce_loss(x, t))
    ours("bce_with_logits", lambda x: losses.bce_with_logits_loss(x, t))
    liger = _peer("liger_kernel.transformers")
    if liger is not None:
        ce = liger.LigerCrossEntropyLoss()
        cez = liger.LigerCrossEntropyLoss(lse_square_scale=1e-4)

        def ref_z():
            with pytorch_path():
                return float(losses.cross_entropy_with_logz_penalty(base.detach(), t, coef=1e-4))
        cases.append(Case("Liger CE", fresh, lambda x: ce(x, t), ref_ce))
        cases.append(Case("Liger CE lse_square_scale=1e-4", fresh, lambda x: cez(x, t), ref_z))
    return cases


def _lm_head_cases(shape, dtype, device) -> List[Case]:
    import torch
    import torch.nn.functional as F

    import losses

    n, h, v = shape
    g = torch.Generator(device=device).manual_seed(0)
    x0 = (torch.randn(n, h, generator=g, device=device) * 0.5).to(dtype)
    w0 = (torch.randn(v, h, generator=g, device=device) / h ** 0.5).to(dtype)
    t = torch.randint(0, v, (n,), generator=g, device=device)

    def fresh():
        return x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)

    def ref():
        return float(F.cross_entropy((x0.float() @ w0.float().T), t))

    from losses.kernels import triton_linear

    k2 = 2 * triton_linear.chunk_columns(n, v, x0.element_size())

    def matmuls(count):
        def run(x, w):
            with torch.no_grad():
                z = x @ w.T
                if count == 4:
                    z = x @ w.T
                z.T @ x
                z @ w
        return run

    cases = [Case("naive bf16", fresh, lambda x, w: F.cross_entropy(x @ w.T, t), ref),
             Case("linear_cross_entropy", fresh, lambda x, w: losses.linear_cross_entropy(x, t, w), ref),
             Case("linear_cross_entropy, chunks x2", fresh,
                  lambda x, w: losses.linear_cross_entropy(x, t, w, chunk_size=k2), ref),
             Case("bound: 3 bf16 matmuls (the naive path's)", fresh, matmuls(3), backward=False),
             Case("bound: 4 bf16 matmuls (no stored logits)", fresh, matmuls(4), backward=False)]
    liger = _peer("liger_kernel.transformers")
    if liger is not None:
        flce = liger.LigerFusedLinearCrossEntropyLoss()
        cases.append(Case("Liger fused linear CE", fresh, lambda x, w: flce(w, x, t), ref))
    cce = _peer("cut_cross_entropy")
    if cce is not None:
        cases.append(Case("cut-cross-entropy exact", fresh,
                          lambda x, w: cce.linear_cross_entropy(x, w, t, filter_eps=None), ref))
        cases.append(Case("cut-cross-entropy filter", fresh, lambda x, w: cce.linear_cross_entropy(x, w, t), ref))
    return cases


def _sparse_cases(shape, dtype, device) -> List[Case]:
    import torch.nn.functional as F

    import losses

    b, c = shape
    base, t, fresh = _logit_inputs(b, c, dtype, device)

    cases = [Case("F.cross_entropy", fresh, lambda x: F.cross_entropy(x, t),
                  lambda: float(F.cross_entropy(base.detach().float(), t)))]
    for name, fn in (("sparsemax", losses.sparsemax_loss), ("entmax15", losses.entmax15_loss)):
        def ref(fn=fn):
            with pytorch_path():
                return float(fn(base.detach().double(), t))
        cases.append(Case(name, fresh, lambda x, fn=fn: fn(x, t), ref))
    ent = _peer("entmax")
    if ent is not None:
        sp, e15 = ent.SparsemaxLoss(), ent.Entmax15Loss()

        def ref_ours(fn):
            with pytorch_path():
                return float(fn(base.detach().double(), t))
        cases.append(Case("entmax pkg SparsemaxLoss", fresh, lambda x: sp(x.float(), t).mean(),
                          lambda: ref_ours(losses.sparsemax_loss)))
        cases.append(Case("entmax pkg Entmax15Loss", fresh, lambda x: e15(x.float(), t).mean(),
                          lambda: ref_ours(losses.entmax15_loss)))
    return cases


def _config_cases(shape, dtype, device) -> List[Case]:

    import losses
    from losses.kernels import triton_rows

    b, c = shape
    base, t, fresh = _logit_inputs(b, c, dtype, device)

    def with_config(cfg, vec, backward=True):
        def run(x):
            before = triton_rows.override_config, triton_rows.vector_sums
            triton_rows.override_config, triton_rows.vector_sums = cfg, vec
            try:
                loss = losses.cross_entropy_loss(x, t)
                if backward:
                    loss.backward()
            finally:
                triton_rows.override_config, triton_rows.vector_sums = before
            return loss
        return run

    cases = [Case("heuristic", fresh, with_config(None, False), backward=False),
             Case("heuristic, forward only", fresh, with_config(None, False, False), backward=False),
             Case("heuristic + vector sums", fresh, with_config(None, True), backward=False),
             Case("heuristic + vector sums, forward only", fresh, with_config(None, True, False), backward=False)]
    for vec in (False, True):
        cases += [Case(f"BLOCK={blk} warps={w}{' + vector sums' if vec else ''}", fresh, with_config((blk, w), vec),
                       backward=False) for blk, w in CONFIGS]
    return cases


BUILDERS = {"logits": _logits_cases, "lm_head": _lm_head_cases, "sparse": _sparse_cases, "configs": _config_cases}


def grad_bytes(args) -> int:
    """Bytes of the gradient buffers the call left on its inputs (a gradient written over its own
    input's storage, as the in-place options do, is not new memory and does not count)."""
    import torch

    total = 0
    for a in args:
        g = getattr(a, "grad", None) if isinstance(a, torch.Tensor) else None
        if g is not None and g.data_ptr() != a.data_ptr():
            total += g.numel() * g.element_size()
    return total


def measure(cases: Sequence[Case], device: str, repeats: int, warmup: int) -> Dict[str, Dict]:
    """Value check, peak extra memory, then interleaved timings of ``cases``."""
    import torch

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out: Dict[str, Dict] = {c.name: {"times": []} for c in cases}
    for c in cases:  # value check and memory, one untimed call each
        rec = out[c.name]
        try:
            args = c.setup()
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            value = c.call(args)
            sync()
            if cuda:
                rec["peak_extra_mb"] = (torch.cuda.max_memory_allocated() - before) / 2 ** 20
                rec["beyond_grads_mb"] = rec["peak_extra_mb"] - grad_bytes(args) / 2 ** 20
            del args
            if c.reference is not None:
                got = float(value)
                want = c.reference()
                rec["rel_err"] = abs(got - want) / max(abs(want), 1e-12)
        except Exception as exc:  # a case that fails at this size: reported, not fatal
            rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
    live = [c for c in cases if "error" not in out[c.name]]
    for rep in range(warmup + repeats):
        for c in live:
            args = c.setup()
            sync()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                c.call(args)
                end.record()
                sync()
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                c.call(args)
                ms = (time.perf_counter() - t0) * 1e3
            del args
            if rep >= warmup:
                out[c.name]["times"].append(ms)
    return out


def run(args: argparse.Namespace) -> List[Dict]:
    import torch

    import losses

    rows: List[Dict] = []
    with losses.validation(False):
        for group in args.groups:
            ref_name, floor_name = ANCHORS[group]
            for shape, dtypes in SIZES[group][1 if args.small else 0]:
                for dt in dtypes:
                    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dt]
                    cases = BUILDERS[group](shape, dtype, args.device)
                    res = measure(cases, args.device, args.repeats, args.warmup)
                    for c in cases:
                        r = res[c.name]
                        t = r["times"]
                        row = {"group": group, "dtype": dt, "shape": "x".join(map(str, shape)), "case": c.name,
                               "error": r.get("error", ""), "peak_extra_mb": r.get("peak_extra_mb"),
                               "beyond_grads_mb": r.get("beyond_grads_mb"),
                               "rel_err": r.get("rel_err"), "n": len(t)}
                        if t:
                            row.update(ms=statistics.median(t), q1=_quantile(t, 0.25), q3=_quantile(t, 0.75))
                            for col, other in (("x_ref", ref_name), ("x_floor", floor_name)):
                                o = res.get(other, {}).get("times") if other else None
                                pr = paired_ratio(t, o) if o else None
                                row[col] = pr["ratio"] if pr else None
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                    del cases
                    if args.device.startswith("cuda"):
                        torch.cuda.empty_cache()
    return rows


def _fmt(v, spec: str) -> str:
    return "" if v is None or v == "" else format(v, spec)


def meta_info(device: str) -> Dict:
    import torch

    info = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine()}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    if device.startswith("cuda"):
        info["device_name"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    for mod, key in (("liger_kernel", "liger_kernel"), ("cut_cross_entropy", "cut_cross_entropy"), ("entmax", "entmax")):
        try:
            from importlib.metadata import version

            info[key] = version(mod.replace("_", "-")) if _peer(mod) is not None else None
        except Exception:
            info[key] = None
    import losses

    info["kernels"] = {k: list(v) for k, v in losses.native_kernels().items()}
    return info


def write(rows: List[Dict], out: str, meta: Dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in COLUMNS})
    peers = ", ".join(f"{k} {meta.get(k)}" for k in ("liger_kernel", "cut_cross_entropy", "entmax"))
    lines = [f"# GPU kernels side by side on {meta.get('device_name', meta.get('device'))}", "",
             f"torch {meta.get('torch')}, triton {meta.get('triton')}, CUDA {meta.get('cuda')}; peers: {peers}. "
             f"Forward + backward, data checks off, cases interleaved ({meta.get('repeats')} repetitions after "
             f"{meta.get('warmup')} warm-up), fresh inputs per repetition (untimed). `x ref` / `x floor`: medians "
             "of the per-repetition ratios to the group's anchors (logits: `F.cross_entropy` / a device copy of "
             "the logits; lm_head: the naive bf16 `x @ W.T` + `F.cross_entropy`; sparse: `F.cross_entropy`). "
             "`peak extra`: peak allocated during one call minus what was allocated before it; `beyond grads`: "
             "the same less the gradient buffers left on the inputs (a gradient written over its input's own "
             "storage is not new memory). `rel err`: the "
             "loss value against its reference (the library's PyTorch path, or `F.cross_entropy`).", ""]
    for group in GROUPS:
        grows = [r for r in rows if r["group"] == group]
        if not grows:
            continue
        lines += [f"## {group}", "", "| dtype | shape | case | ms (median) | q1-q3 | x ref | x floor | peak extra MB "
                  "| beyond grads MB | rel err | error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in grows:
            lines.append(f"| {r['dtype']} | {r['shape']} | {r['case']} | {_fmt(r.get('ms'), '.3f')} | "
                         f"{_fmt(r.get('q1'), '.3f')}-{_fmt(r.get('q3'), '.3f')} | {_fmt(r.get('x_ref'), '.2f')} | "
                         f"{_fmt(r.get('x_floor'), '.2f')} | {_fmt(r.get('peak_extra_mb'), '.0f')} | "
                         f"{_fmt(r.get('beyond_grads_mb'), '.0f')} | "
                         f"{_fmt(r.get('rel_err'), '.1e')} | {r.get('error', '')} |")
        lines.append("")
    with open(os.path.join(out, "gpu.md"), "w") as fh:
        fh.write("\n".join(lines))
    with open(os.path.join(out, "gpu_meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)


def parse_args(argv: Sequence[str] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--groups", default="logits,lm_head,sparse", help=f"comma-separated, of {', '.join(GROUPS)}")
    p.add_argument("--small", action="store_true", help="tiny shapes (the harness on a CPU)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=os.path.join("results", "perf", "gpu"))
    args = p.parse_args(argv)
    args.groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    bad = [g for g in args.groups if g not in GROUPS]
    if bad or not args.groups:
        raise SystemExit(f"perf_gpu: --groups takes {', '.join(GROUPS)} (got {bad or args.groups})")
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit(f"perf_gpu: --repeats must be >= 1 and --warmup >= 0 (got {args.repeats}, {args.warmup})")
    return args


def main(argv: Sequence[str] = None) -> int:
    import torch

    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("perf_gpu: no CUDA device visible (torch.cuda.is_available() is False); run it on a GPU "
                         "machine or pass --device cpu --small")
    rows = run(args)
    meta = meta_info(args.device)
    meta.update(repeats=args.repeats, warmup=args.warmup, groups=args.groups)
    write(rows, args.out, meta)
    print(f"perf_gpu: wrote {os.path.join(args.out, 'gpu.md')}")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
