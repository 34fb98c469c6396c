"""One recipe run for ``benchmarks/reproduce_results.py`` (``reproduce.running.execute``), in a process
of its own (a fresh interpreter, or a process forked from the driver's fork server: :func:`forked_main`).

``python benchmarks/_reproduce_worker.py SPEC.json OUT.json`` where ``SPEC.json`` holds
``{"config": path, "root": dir, "fit_args": [...], "test_args": [...], "fit": bool, "test": bool}``
and optionally ``"test_items": path``.

Runs the project's CLI entry point (``lightning_modules.cli.main``, the function behind
``python -m lightning_modules``) twice in this process: ``fit`` with ``fit_args``, then ``test``
with ``test_args`` from the checkpoint the fit saved (the last one written: recipes keep
Lightning's default ``ModelCheckpoint``, i.e. the end of the last epoch). With ``"fit": false``
only ``test`` runs, on the untrained model (zero-shot references); with ``"test": false`` only
``fit`` runs (tuning runs: their validation metrics are the result). Writes the test metrics the
LightningModule logged (``test/...``), the validation curve of the fit (``curve``: every ``val/...``
metric per validation epoch, from the CSV logger), wall times, the epochs trained, the DataModule's
data sizes and test-split fingerprint (``data.test_split``), peak RSS, the device the run trained on
(``device``: ``cpu: <processor model>`` or ``cuda: <GPU name>``) and the library versions to
``OUT.json``. With ``"test_items"`` the test also writes that file
(:class:`lightning_modules.records.TestItemRecorder`: the per-item values behind each test metric,
for a bootstrap over training seeds and test items); ``test_items`` in ``OUT.json`` names it.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import resource
import sys
import time
import traceback


def _threads() -> int:
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def _scalars(metrics) -> dict:
    import torch

    out = {}
    for k, v in metrics.items():
        if torch.is_tensor(v) and v.numel() == 1:
            out[k] = float(v)
        elif isinstance(v, (int, float)):
            out[k] = float(v)
    return out


def _data_info(dm) -> dict:
    """Data sizes a result should be reported with (whatever the DataModule exposes)."""
    info = {}
    meta = getattr(dm, "meta", None)
    if isinstance(meta, dict):
        for k, v in meta.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                info[k] = v
    sizes = getattr(dm, "split_sizes", None)
    if callable(sizes):
        try:
            for k, v in sizes().items():
                info[f"{k}_size"] = int(v)
        except Exception:  # pragma: no cover - a DataModule without splits
            pass
    counts = getattr(dm, "class_counts", None)
    if counts is not None:
        info["train_class_counts"] = " ".join(str(int(c)) for c in counts.tolist())
    noise = getattr(dm, "noise_mask", None)
    if noise is not None and noise.numel():
        info["train_noise_fraction"] = round(float(noise.float().mean()), 4)
    for name in ("num_classes", "num_users", "num_items"):
        v = getattr(dm, name, 0)
        if v:
            info[name] = int(v)
    fingerprint = getattr(dm, "test_split_fingerprint", None)
    if callable(fingerprint):  # the test split's name: equal across runs exactly when it is the same split
        info["test_split"] = str(fingerprint())
    return info


def _logged_rows(trainer) -> list:
    """The rows of the CSV logger's ``metrics.csv`` of the run (one per logging call), or ``[]``
    when it has none."""
    import csv

    for logger in getattr(trainer, "loggers", None) or []:
        d = getattr(logger, "log_dir", None)
        if d and os.path.isfile(os.path.join(d, "metrics.csv")):
            with open(os.path.join(d, "metrics.csv"), newline="") as fh:
                return list(csv.DictReader(fh))
    return []


#: the per-step training scalars a run keeps (``trace``) where it logged them: the loss and the
#: language model's log Z (its mean and spread over the step's tokens)
TRACE_METRICS = ("train/loss", "train/logz_mean", "train/logz_std")


def _trace(trainer, points: int = 200, digits: int = 6) -> dict:
    """``{metric: [[step, value], ...]}`` of the :data:`TRACE_METRICS` the run logged per step (every
    ``log_every_n_steps``), read from ``metrics.csv``, thinned evenly to at most ``points`` entries
    per metric (the first and last kept). Empty when the run logged none of them."""
    got: dict = {}
    for row in _logged_rows(trainer):
        step = row.get("step")
        if step in ("", None):
            continue
        for k in TRACE_METRICS:
            if row.get(k) not in ("", None):
                got.setdefault(k, []).append([int(float(step)), float(f"{float(row[k]):.{digits}g}")])
    out = {}
    for k, xs in got.items():
        if len(xs) > points:
            idx = sorted({round(i * (len(xs) - 1) / (points - 1)) for i in range(points)})
            xs = [xs[i] for i in idx]
        out[k] = xs
    return out


def _curve(trainer, digits: int = 6) -> dict:
    """``{metric: [value per validation pass]}`` of the ``val/...`` scalars the run logged, read from
    the CSV logger's ``metrics.csv`` (one row per logging call; the validation rows carry ``epoch``
    and ``step``): one point per validation pass, in order -- per epoch, or several per epoch when the
    run validates within it (``val_check_interval``). Empty when the run has no CSV log or validated
    never."""
    by_pass: dict = {}
    for row in _logged_rows(trainer):
        vals = {k: v for k, v in row.items() if k and k.startswith("val/") and v not in ("", None)}
        if not vals or row.get("epoch") in ("", None):
            continue
        step = row.get("step")
        key = (int(float(row["epoch"])), int(float(step)) if step not in ("", None) else -1)
        by_pass.setdefault(key, {}).update({k: float(v) for k, v in vals.items()})
    passes = sorted(by_pass)
    names = sorted({k for e in passes for k in by_pass[e]})
    return {k: [float(f"{by_pass[e][k]:.{digits}g}") if k in by_pass[e] else None for e in passes] for k in names}


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what :mod:`platform` says."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _device(trainer) -> str:
    """``cuda: <GPU name>`` where the trainer ran on a CUDA device, else ``cpu: <processor model>``."""
    import torch

    dev = getattr(getattr(trainer, "strategy", None), "root_device", None)
    if dev is not None and dev.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    return f"cpu: {cpu_model()}"


def run(spec: dict) -> dict:
    import torch

    torch.set_num_threads(_threads())
    import pytorch_lightning as pl

    from lightning_modules.cli import main

    root = spec["root"]
    os.makedirs(root, exist_ok=True)
    common = [f"--trainer.default_root_dir={root}", "--trainer.enable_progress_bar=false",
              "--trainer.enable_model_summary=false"]
    result = {"ok": False, "fit_seconds": 0.0, "epochs": 0, "fit_metrics": {}}
    ckpt_args = []
    if spec.get("fit", True):
        t0 = time.perf_counter()
        fit = main(args=["fit", "--config", spec["config"], *common, *spec.get("fit_args", [])])
        result["fit_seconds"] = time.perf_counter() - t0
        result["epochs"] = int(fit.trainer.current_epoch)
        result["steps"] = int(fit.trainer.global_step)
        result["fit_metrics"] = _scalars(fit.trainer.callback_metrics)
        result["curve"] = _curve(fit.trainer)
        result["trace"] = _trace(fit.trainer)
        result["device"] = _device(fit.trainer)
        if not spec.get("test", True):
            result["data"] = _data_info(fit.datamodule)
            result["val_metrics"] = {k: v for k, v in result["fit_metrics"].items() if k.startswith("val/")}
            result.update(_env(torch, pl))
            result["ok"] = True
            return result
        ckpts = sorted(glob.glob(os.path.join(root, "**", "*.ckpt"), recursive=True), key=os.path.getmtime)
        if not ckpts:
            raise RuntimeError(f"fit wrote no checkpoint under {root}")
        result["checkpoint"] = os.path.relpath(ckpts[-1], root)
        ckpt_args = [f"--ckpt_path={ckpts[-1]}"]
        del fit
    t0 = time.perf_counter()
    # the per-item values behind each test metric (for a bootstrap over seeds and test items), where
    # the spec names a file for them
    items = spec.get("test_items")
    record = ["--trainer.callbacks+=lightning_modules.records.TestItemRecorder",
              f"--trainer.callbacks.path={items}"] if items else []
    test = main(args=["test", "--config", spec["config"], *common, *spec.get("test_args", []), *record, *ckpt_args])
    if items and os.path.exists(items):
        result["test_items"] = items
    result["test_seconds"] = time.perf_counter() - t0
    result["test_metrics"] = {k: v for k, v in _scalars(test.trainer.callback_metrics).items() if k.startswith("test/")}
    result.setdefault("device", _device(test.trainer))
    result["data"] = _data_info(test.datamodule)
    result.update(_env(torch, pl))
    result["ok"] = True
    return result


def _env(torch, pl) -> dict:
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "versions": {"python": platform.python_version(), "sys_version": sys.version.replace("\n", " "),
                         "torch": torch.__version__, "pytorch_lightning": pl.__version__,
                         "threads": torch.get_num_threads()}}


def main_cli(argv) -> int:
    spec_path, out_path = argv[1], argv[2]
    with open(spec_path) as fh:
        spec = json.load(fh)
    t0 = time.perf_counter()
    try:
        result = run(spec)
    except BaseException as exc:  # report, never hang the driver
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
    result["wall_seconds"] = time.perf_counter() - t0
    tmp = out_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=True)
    os.replace(tmp, out_path)
    return 0 if result.get("ok") else 1


def forked_main(spec_path: str, out_path: str, log_path: str, env: dict, root: str) -> None:
    """The same run in a process forked from the reproduction's fork server (``reproduce.running``,
    which imported torch, Lightning and the CLI before forking): output to ``log_path``, the run's
    environment variables set, the repository as the working folder, warnings off as
    ``PYTHONWARNINGS=ignore`` does for a fresh interpreter. Exits with :func:`main_cli`'s status."""
    import warnings

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.update(env)
    os.chdir(root)
    warnings.simplefilter("ignore")
    code = main_cli([__file__, spec_path, out_path])
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    sys.exit(main_cli(sys.argv))
