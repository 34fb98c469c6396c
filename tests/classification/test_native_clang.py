"""The C kernels built by clang: each builds, carries the AVX2 / AVX-512 copies where the CPU runs
them (clang compiles them under ``#pragma clang attribute``, GCC under ``#pragma GCC target``), and
passes the kernels' own float64 tests on every copy.

The rest of the suite builds the kernels with the machine's first compiler (``cc``, GCC here); this
test builds them again with ``CC=clang`` into an empty cache folder and runs the kernel test files
in a fresh pytest process against that build. The tests of those files that are about the
compiler itself (no compiler, a C++ driver, a fortifying GCC, the build report, the first build
inside ``torch.compile``) and the precision benchmark script are left to the main run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNEL_TESTS = ["tests/classification/test_rows_native.py", "tests/classification/test_dice_native.py",
                "tests/classification/test_entmax_native.py"]
COMPILER_TESTS = ("torch_compile", "cxx_driver", "fortifies", "without_a_compiler", "reports", "precision_benchmark")

pytestmark = pytest.mark.slow


def _cpu_flags() -> set:
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def _clang_env(tmp_path) -> dict:
    clang = shutil.which("clang")
    assert clang, "clang is not installed (./scripts/install.sh --docs-test installs it with apt)"
    return {**os.environ, "CC": clang, "LOSSES_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": ROOT}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
def test_kernels_build_with_clang_with_every_copy_this_cpu_runs_and_pass_their_tests(tmp_path):
    env = _clang_env(tmp_path)
    probe = textwrap.dedent("""
        from losses.kernels import dice_native, entmax_native, rows_native
        for m in (rows_native, dice_native, entmax_native):
            lib = m._KERNEL.load()
            assert lib is not None, m._KERNEL.why
            print(m.__name__.rsplit(".", 1)[1], ",".join(getattr(m, "variants", lambda: ())()), m._KERNEL.why)
    """)
    res = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    assert set(lines) == {"rows_native", "dice_native", "entmax_native"}, res.stdout
    for name, rest in lines.items():
        assert "built with clang" in rest and str(tmp_path) in rest, (name, rest)
    flags = _cpu_flags()
    expected = ["base"]
    if {"avx2", "fma"} <= flags:
        expected.insert(0, "avx2")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        expected.insert(0, "avx512")
    if "x86_64" in os.uname().machine:
        for name in ("rows_native", "dice_native"):  # the vectorised kernels: every copy this CPU runs
            assert lines[name].split(" ", 1)[0].split(",") == expected, (name, lines[name], expected)
    # the libraries are clang's: its name in the .comment section of every one
    libs = sorted((tmp_path / "kernels").glob("*.so"))
    assert len(libs) == 3 and all(b"clang version" in p.read_bytes() for p in libs), libs

    # the kernels' own tests, on these libraries (the cache folder is shared: nothing is rebuilt)
    select = " and ".join(f"not {t}" for t in COMPILER_TESTS)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf",
                          "-k", select, *KERNEL_TESTS], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and " failed" not in res.stdout, res.stdout[-2000:]
    assert sorted((tmp_path / "kernels").glob("*.so")) == libs  # the same three libraries, none rebuilt
