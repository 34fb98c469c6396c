"""Shared pytest configuration: offline mode, thread limits, per-file wall times."""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not (os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi")):
    # no NVIDIA GPU: Triton runs its kernels through its interpreter, on CPU tensors, where a test
    # asks for it (losses.kernels.interpret(); tests/test_triton_kernels.py). Triton reads this
    # when torch imports it, so it is set before the import below. CPU losses outside those blocks
    # take their PyTorch paths as always.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two xdist workers on two cores: one intra-op thread each, and one for every process a test
    # starts (CLI runs, the README's commands, distributed ranks): a child with torch's default of
    # one thread per core would spin against the other worker (measured: the README's commands
    # took 164 s beside a busy worker, 40 s alone)
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

_FILE_TIMES: dict = collections.defaultdict(float)
_SESSION_CACHE = None


def pytest_configure(config):
    """The caches the tests build (MiniLM embeddings of the retrieval sets, the parsed stdlib pairs)
    go to one temporary folder per test session, shared by the xdist workers and by the CLI runs
    in subprocesses (they inherit ``$LOSSES_CACHE_DIR``), and removed at the end: a test run
    never writes into the user's home. A ``$LOSSES_CACHE_DIR`` set before pytest starts is used as
    it is (to keep caches between runs)."""
    global _SESSION_CACHE
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("LOSSES_CACHE_DIR"):
        return  # a worker inherits the controller's folder; a user's folder is kept
    _SESSION_CACHE = tempfile.mkdtemp(prefix="softmax-losses-test-cache-")
    os.environ["LOSSES_CACHE_DIR"] = _SESSION_CACHE


def pytest_unconfigure(config):
    global _SESSION_CACHE
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
        os.environ.pop("LOSSES_CACHE_DIR", None)
        _SESSION_CACHE = None


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    _FILE_TIMES[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _FILE_TIMES:
        return
    terminalreporter.section("wall time per test file (sum of test phases)")
    for path, secs in sorted(_FILE_TIMES.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{secs:8.1f} s  {path}")


@pytest.fixture(autouse=True)
def _validation_on():
    """Every test starts with data checks on and leaves them as it found them."""
    import losses

    with losses.validation(True):
        yield


@pytest.fixture
def no_experimental_warning():
    import losses

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", losses.ExperimentalWarning)
        yield
