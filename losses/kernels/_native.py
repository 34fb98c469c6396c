"""Building the optional C kernels (shared by every kernel module).

A kernel module holds its C source as a string; :func:`compile_library` compiles it once with the
system's C compiler (``$CC``, else ``cc``, ``gcc``, ``clang``, or a C++ driver such as ``g++``, the
compiler ``torch.compile`` needs on CPU, told to read the file as C) into
``$LOSSES_CACHE_DIR/kernels`` (default ``~/.cache/softmax-losses/kernels``), under a name that
hashes the source, the flags, the compiler and the machine. The file is written to a temporary
folder and renamed into place, so concurrent processes (``pytest -n``, a DDP job) may all build at
once and each loads a whole library. ``LOSSES_NATIVE=0`` in the environment, no compiler, or a
platform other than Linux / macOS: nothing is built, and the caller runs its PyTorch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Callable, List, Optional, Tuple

__all__: list = []


def cache_dir() -> str:
    root = os.environ.get("LOSSES_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "softmax-losses")
    return os.path.join(root, "kernels")


def compiler() -> Optional[str]:
    # a C++ driver compiles the source as C too ("-x c" below): machines with only g++ (what
    # torch.compile's CPU backend needs) build the kernels as well
    for name in (os.environ.get("CC"), "cc", "gcc", "clang", "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def disabled() -> bool:
    return os.environ.get("LOSSES_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


#: flags every kernel is compiled with, before its own. ``-U_FORTIFY_SOURCE``: a GCC that defines
#: ``_FORTIFY_SOURCE`` by default whenever it optimises (Ubuntu's, for one) turns ``memcpy`` into an
#: ``always_inline`` wrapper built for the default target, which GCC refuses to inline into the
#: AVX2 / AVX-512 copies of :func:`isa_source` ("inlining failed in call to 'always_inline'
#: 'memcpy': target specific option mismatch"), so the build failed and the PyTorch path ran. The
#: kernels' only ``memcpy`` calls reinterpret the bits of one 4- or 8-byte number.
BASE_FLAGS = ["-U_FORTIFY_SOURCE"]


def _first_errors(stderr: str, limit: int = 300) -> str:
    """The compiler's first error lines (a diagnostic opens with the chain of files that included
    the one in error, which says nothing by itself); the start of the output where none says
    ``error``."""
    lines = [x.strip() for x in stderr.splitlines() if "error" in x.lower()]
    text = " | ".join(lines[:3]) if lines else stderr.strip()
    return text[:limit]


def compile_library(stem: str, source: str, flags: List[str]) -> Tuple[Optional[str], str]:
    """``(path of the shared library, "built with <compiler>: <path>")``, or ``(None, why not)``.

    A failed build says the compiler's first error lines and keeps its whole output in the cache
    folder (``<stem>_<hash>.log``, named in the message)."""
    if disabled():
        return None, "disabled by LOSSES_NATIVE=0"
    if not sys.platform.startswith(("linux", "darwin")):
        return None, f"not built on {sys.platform}"
    cc = compiler()
    if cc is None:
        return None, "no C compiler found ($CC, cc, gcc, clang, c++, g++, clang++)"
    flags = [*BASE_FLAGS, *flags]
    key = hashlib.sha256("\0".join([source, " ".join(flags), cc, platform.machine(), sys.platform])
                         .encode()).hexdigest()[:16]
    folder = cache_dir()
    path = os.path.join(folder, f"{stem}_{key}.so")
    if not os.path.exists(path):
        try:
            os.makedirs(folder, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                src = os.path.join(tmp, f"{stem}.c")
                with open(src, "w") as fh:
                    fh.write(source)
                so = os.path.join(tmp, f"{stem}.so")
                cmd = [cc, *flags, "-x", "c", src, "-x", "none", "-o", so, "-lm"]
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                if done.returncode != 0:
                    log = os.path.join(folder, f"{stem}_{key}.log")
                    with open(log, "w") as fh:
                        fh.write(" ".join(cmd) + "\n\n")
                        fh.write(done.stdout + done.stderr)
                    return None, f"{os.path.basename(cc)} failed: {_first_errors(done.stderr)} (whole output: {log})"
                os.replace(so, path)  # atomic: a concurrent build writes the same bytes
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"build failed: {exc}"
    return path, f"built with {os.path.basename(cc)}: {path}"


#: (name, target) of the instruction-set copies a vectorised kernel is compiled in on x86-64 with
#: GCC or clang, best first; the copy the CPU can run is chosen when the library loads
ISA_VARIANTS = (("avx512", "arch=skylake-avx512"), ("avx2", "arch=haswell"))
#: the variants' names in the order of the dispatch function's return value
ISA_NAMES = ("base", "avx2", "avx512")


def isa_source(head: str, body: str, prefix: str) -> str:
    """C source holding ``head``, a function ``int <prefix>_variant(void)`` (the best copy this CPU
    runs: 0 base, 1 AVX2 + FMA, 2 AVX-512) and ``body`` once per variant, ``@V@`` in it replaced by
    the variant's name (``base`` always; ``avx2`` and ``avx512`` on x86-64, under ``#pragma GCC
    target`` with GCC and under ``#pragma clang attribute`` giving every function of the copy the
    same ``target`` attribute with clang). Each copy is the same C: the compiler vectorises it for
    its target, and the loaded library calls the copy the CPU supports."""
    dispatch = rf"""
#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_VARIANTS 1
#endif

int {prefix}_variant(void) {{
#ifdef HAVE_VARIANTS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
    return 0;
}}
"""
    parts = [head, dispatch, body.replace("@V@", "base"), "#ifdef HAVE_VARIANTS\n"]
    for name, target in ISA_VARIANTS:
        parts.append(f'#if defined(__clang__)\n#pragma clang attribute push (__attribute__((target("{target}"))), '
                     f'apply_to = function)\n#else\n#pragma GCC push_options\n#pragma GCC target("{target}")\n'
                     f'#endif\n')
        parts.append(body.replace("@V@", name))
        parts.append("#if defined(__clang__)\n#pragma clang attribute pop\n#else\n#pragma GCC pop_options\n#endif\n")
    parts.append("#endif\n")
    return "".join(parts)


#: C source of a vectorisable float ``exp`` (name ``exp_@V@``, one copy per ISA variant): Cody-Waite
#: range reduction and a degree-6 polynomial, within one float spacing over [-87.3, 88]; 0 below
#: -87.3, the argument clamped at 88 above; ``-inf`` gives 0. Shared by the CPU kernels, with its
#: three steps (``exp_reduce_@V@``, ``exp_poly_@V@``: the ``expm1`` of the reduced argument,
#: ``exp2i_@V@``) for kernels that specialise an exponential to a known argument range.
EXP_C = r"""
/* w = n ln 2 + r: returns n, the nearest integer to w / ln 2, and *r (ln 2 in two parts) */
static inline float exp_reduce_@V@(float w, float* r) {
    float n = (w * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* nearest integer */
    float t = w - n * 0.693359375f;
    *r = t - n * -2.12194440e-4f;
    return n;
}

/* exp(r) - 1 for a reduced argument |r| <= ln 2 / 2: r + r^2 P(r), P of degree 5 */
static inline float exp_poly_@V@(float r) {
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r;
}

/* 2^n for an integer-valued n in [-126, 127] (the exponent field) */
static inline float exp2i_@V@(float n) {
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return scale;
}

static inline float exp_@V@(float v) {
    float w = v < -87.33654f ? -87.33654f : (v > 88.0f ? 88.0f : v);
    float r;
    float n = exp_reduce_@V@(w, &r);
    float p = (exp_poly_@V@(r) + 1.0f) * exp2i_@V@(n);
    return v < -87.33654f ? 0.0f : p;
}
"""


class NativeLibrary:
    """One optional C library of a kernel module: compiled (:func:`compile_library`) and loaded on
    the first :meth:`load` of the process, once, under a lock; ``declare(lib)`` sets the
    functions' ``argtypes`` / ``restype`` and may return a note for the detail (e.g. the
    instruction-set variant in use). ``tried``, ``lib`` and ``why`` hold the outcome."""

    def __init__(self, stem: str, source: str, flags: List[str], declare: Callable[[ctypes.CDLL], Optional[str]]):
        self.stem, self.source, self.flags, self.declare = stem, source, flags, declare
        self.lib: Optional[ctypes.CDLL] = None
        self.tried = False
        self.why = "not built yet"
        self._lock = threading.Lock()

    def _build(self) -> Tuple[Optional[ctypes.CDLL], str]:
        path, why = compile_library(self.stem, self.source, self.flags)
        if path is None:
            return None, why
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            return None, f"load failed: {exc}"
        note = self.declare(lib)
        return lib, (f"{why} ({note})" if note else why)

    def load(self) -> Optional[ctypes.CDLL]:
        """The loaded library, built on the first call; ``None`` where it cannot be (``why`` says)."""
        if self.tried:
            return self.lib
        with self._lock:
            if not self.tried:
                self.lib, self.why = self._build()
                self.tried = True
        return self.lib
