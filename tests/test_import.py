"""`import losses` must pull in nothing beyond torch (checked in a fresh interpreter), and none of
torch's own heavy optional parts: the compiler stack (Dynamo, ~1.2 s to import) loads only when a
user compiles."""

import subprocess
import sys

FORBIDDEN = [
    "pytorch_lightning", "lightning", "torchmetrics", "timm", "torchvision", "faiss", "sklearn",
    "sentence_transformers", "transformers", "jsonargparse", "pandas", "scipy", "matplotlib",
    "lightning_modules", "yaml", "PIL",
]


def test_import_losses_pulls_only_torch():
    # what torch itself imports (numpy, on most builds) is not counted against losses
    code = (
        "import sys, torch; before = set(sys.modules); import losses; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        f"bad = sorted(m for m in {FORBIDDEN!r} if m in new); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import losses imported: {out.stdout.strip()}"


def test_import_losses_does_not_load_the_compiler_stack():
    """Dynamo is torch's lazily imported compiler front end; a ``hasattr(torch, "_dynamo")`` at import
    time loads it (~1.2 s here, for every user and every subprocess of the suite)."""
    code = (
        "import sys, torch; before = set(sys.modules); import losses; "
        "print(','.join(sorted(m for m in set(sys.modules) - before "
        "if m.startswith(('torch._dynamo', 'torch._inductor', 'torch.fx.experimental.symbolic_shapes')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import losses imported: {out.stdout.strip()[:300]}"


def test_public_names_resolve():
    import losses

    for name in losses.__all__:
        assert getattr(losses, name) is not None, name
    for name in losses.functional.__all__:
        assert getattr(losses, name) is getattr(losses.functional, name)
