"""Run a function in real ``torch.distributed`` gloo processes on CPU (no mocks).

Usage::

    from tests.dist_utils import run_gloo

    def worker(rank, world_size, payload):   # module-level (picklable) function
        ...                                   # process group already initialised (gloo)
        return {"loss": loss.detach(), ...}   # anything torch.save can write

    results = run_gloo(worker, world_size=2, payload=...)   # list, one entry per rank

Each worker runs with ``OMP_NUM_THREADS=1`` and ``torch.set_num_threads(1)`` (CI sizing, docs/conventions.md). Exceptions in a worker are re-raised in the parent with the worker's traceback.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from typing import Any, Callable, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world_size: int, init_file: str, out_dir: str, fn: Callable, payload: Any) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, payload)
        torch.save({"ok": True, "result": result}, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:  # noqa: BLE001 - report any failure to the parent
        torch.save({"ok": False, "error": traceback.format_exc()}, os.path.join(out_dir, f"rank{rank}.pt"))
        raise
    finally:
        try:
            dist.barrier()
        except Exception:  # noqa: BLE001
            pass
        dist.destroy_process_group()


def run_gloo(fn: Callable, world_size: int = 2, payload: Any = None, timeout: float = 300.0) -> List[Any]:
    """Spawn ``world_size`` gloo processes running ``fn(rank, world_size, payload)``."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        ctx = mp.start_processes(
            _entry,
            args=(world_size, init_file, tmp, fn, payload),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        failed = None
        try:
            while not ctx.join(timeout=timeout):
                pass
        except Exception as exc:  # noqa: BLE001
            failed = exc
        results = []
        for r in range(world_size):
            path = os.path.join(tmp, f"rank{r}.pt")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {r} wrote no result") from failed
            rec = torch.load(path, weights_only=False)
            if not rec["ok"]:
                raise RuntimeError(f"rank {r} failed:\n{rec['error']}")
            results.append(rec["result"])
        if failed is not None:
            raise failed
        return results
