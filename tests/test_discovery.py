"""Discovery: every module under ``losses/<kind>/`` is imported when ``losses`` is, and the losses it
registers are exported as ``losses.<name>`` and ``losses.functional.<name>`` with no hand-kept list
(``losses._registry.export_modules``)."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import losses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIND_PACKAGES = ("losses.classification", "losses.embedding", "losses.ranking")


def _family_modules():
    out = []
    for package in KIND_PACKAGES:
        pkg = importlib.import_module(package)
        out += [f"{package}.{i.name}" for i in pkgutil.iter_modules(pkg.__path__) if not i.name.startswith("_")]
    return sorted(out)


@pytest.mark.parametrize("module_name", _family_modules())
def test_every_family_module_is_imported_and_exported(module_name):
    """Each public file of a kind package is in ``sys.modules`` after ``import losses`` (imported by
    the package, not by this test), its ``__all__`` is re-exported by ``losses``, and its
    functions by ``losses.functional``."""
    assert module_name in sys.modules, f"{module_name} is not imported by `import losses`"
    module = sys.modules[module_name]
    for name in getattr(module, "__all__", ()):
        obj = getattr(module, name)
        assert getattr(losses, name, None) is obj and name in losses.__all__, f"losses.{name} is not exported"
        if callable(obj) and not isinstance(obj, type):
            assert getattr(losses.functional, name, None) is obj and name in losses.functional.__all__, name


@pytest.mark.parametrize("spec", losses.list_losses(), ids=lambda s: s.name)
def test_every_registered_loss_is_reachable(spec):
    """A registered loss's function and module are ``losses.<name>``, in ``losses.__all__``, and the
    function is in ``losses.functional.__all__``; both are defined in a module of a kind package."""
    for obj in (spec.function, spec.module):
        assert getattr(losses, obj.__name__, None) is obj and obj.__name__ in losses.__all__, obj.__name__
        assert obj.__module__.rsplit(".", 1)[0] in KIND_PACKAGES, obj.__module__
    assert getattr(losses.functional, spec.function.__name__) is spec.function
    assert spec.function.__name__ in losses.functional.__all__


def test_a_new_family_file_is_discovered(tmp_path):
    """A file dropped into a kind package (here a copy of the package in a temporary tree) is
    imported, registers and is exported without any other edit."""
    import shutil

    shutil.copytree(os.path.join(ROOT, "losses"), tmp_path / "losses",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "losses" / "classification" / "zz_probe.py").write_text(textwrap.dedent('''
        """A probe family."""
        from torch import nn

        from .._core import auto_extra_repr
        from .._registry import position_unit_weights, register
        from .baselines import cross_entropy_loss

        __all__ = ["zz_probe_loss", "ZZProbeLoss"]


        def zz_probe_loss(input, target, *, ignore_index=-100, reduction="mean"):
            return cross_entropy_loss(input, target, ignore_index=ignore_index, reduction=reduction)


        class ZZProbeLoss(nn.Module):
            def __init__(self, *, ignore_index: int = -100, reduction: str = "mean"):
                super().__init__()
                self.ignore_index, self.reduction = ignore_index, reduction

            extra_repr = auto_extra_repr

            def forward(self, input, target):
                return zz_probe_loss(input, target, ignore_index=self.ignore_index, reduction=self.reduction)


        register("zz_probe", function=zz_probe_loss, module=ZZProbeLoss, inputs="logits", unit="position",
                 unit_weights=position_unit_weights)
        '''))
    code = ("import losses; assert 'zz_probe' in losses.loss_names(); "
            "assert losses.zz_probe_loss is losses.functional.zz_probe_loss; "
            "assert 'ZZProbeLoss' in losses.__all__ and 'zz_probe_loss' in losses.functional.__all__; print('ok')")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_two_modules_exporting_different_objects_under_one_name_is_an_error(tmp_path, monkeypatch):
    pkg = tmp_path / "zz_discovery_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("__all__ = ['f']\ndef f():\n    return 1\n")
    (pkg / "b.py").write_text("__all__ = ['f']\ndef f():\n    return 2\n")
    (pkg / "_private.py").write_text("raise RuntimeError('private modules are not imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from losses._registry import export_modules

    with pytest.raises(ImportError, match=r"^export_modules: two modules of zz_discovery_pkg export different "
                                          r"objects under one name \(got 'f'"):
        export_modules("zz_discovery_pkg", [str(pkg)], {})
    (pkg / "b.py").write_text("from .a import f\n__all__ = ['f']\n")  # a re-export of the same object
    sys.modules.pop("zz_discovery_pkg.b", None)
    namespace: dict = {}
    assert export_modules("zz_discovery_pkg", [str(pkg)], namespace) == ["f"] and namespace["f"]() == 1
