"""Adding a loss is two files: a copy of the focal loss's source file and test file under a new
name, dropped into a copy of the repository, is registered, exported, passes the contract kit,
appears in the README table and the docs, gets a generated smoke recipe that trains through the
LightningCLI, and passes its own tests and the registry-wide tests filtered to it, with nothing
else edited (docs/contributing.md, Adding a loss)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW = "probe_focal"

pytestmark = pytest.mark.slow


def _rename(text: str) -> str:
    """The focal loss renamed by text substitution: class, function and registry name."""
    return (text.replace("FocalLoss", "ProbeFocalLoss").replace("focal_loss", "probe_focal_loss")
            .replace('"focal"', f'"{NEW}"').replace("'focal'", f"'{NEW}'"))


def _copy_repository(dest) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    for folder in ("losses", "lightning_modules", "configs", "tests", "docs", "scripts"):
        shutil.copytree(os.path.join(ROOT, folder), dest / folder, ignore=ignore)
    for name in ("mkdocs.yml", "README.md", "pyproject.toml"):
        shutil.copy(os.path.join(ROOT, name), dest / name)


def _run(args, cwd, timeout=900):
    env = {**os.environ, "PYTHONPATH": str(cwd), "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


CHECKS = textwrap.dedent(f"""
    import importlib.util, os, sys
    import losses
    from losses.testing import check_loss

    spec = losses.get_loss_spec({NEW!r})
    assert losses.probe_focal_loss is spec.function is losses.functional.probe_focal_loss
    assert losses.ProbeFocalLoss is spec.module
    assert "probe_focal_loss" in losses.__all__ and "ProbeFocalLoss" in losses.__all__
    assert "probe_focal_loss" in losses.functional.__all__
    check_loss({NEW!r})

    sys.path.insert(0, "scripts")
    import loss_table
    assert "`{NEW}`" in loss_table.table(), loss_table.table()
    with open("README.md", encoding="utf-8") as fh:
        assert "`{NEW}`" in fh.read(), "README table not regenerated"

    path = os.path.join("docs", "_hooks", "api_pages.py")
    hook_spec = importlib.util.spec_from_file_location("api_pages", path)
    api = importlib.util.module_from_spec(hook_spec)
    hook_spec.loader.exec_module(api)
    module = spec.module.__module__
    title, page, markdown = api.generated_family_pages()[module]
    assert page == "losses/probe_focal.md" and "`{NEW}`" in markdown, (page, markdown[:300])
    assert api.family_pages()[module] == (title, page)
    documented = {{path for path, _ in api.losses_objects()}}
    assert module + ".probe_focal_loss" in documented and module + ".ProbeFocalLoss" in documented
    assert "`{NEW}`" in api.registry_page()
    import yaml
    with open("mkdocs.yml", encoding="utf-8") as fh:
        nav = yaml.safe_load(fh)["nav"]
    assert (title, page) in api.nav_additions(nav)
    print("two-file checks: ok")
""")


def test_a_copied_loss_needs_only_its_two_files(tmp_path):
    _copy_repository(tmp_path)
    with open(os.path.join(ROOT, "losses", "classification", "focal.py"), encoding="utf-8") as fh:
        (tmp_path / "losses" / "classification" / f"{NEW}.py").write_text(_rename(fh.read()), encoding="utf-8")
    with open(os.path.join(ROOT, "tests", "classification", "test_focal.py"), encoding="utf-8") as fh:
        (tmp_path / "tests" / "classification" / f"test_{NEW}.py").write_text(_rename(fh.read()), encoding="utf-8")

    # the one generated edit of the flow
    res = _run([sys.executable, "scripts/update_readme_table.py"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]

    res = _run([sys.executable, "-c", CHECKS], tmp_path)
    assert res.returncode == 0 and "two-file checks: ok" in res.stdout, (res.stdout[-2000:], res.stderr[-4000:])

    # One pytest process (each start re-imports torch and Lightning and re-collects): the entry's own
    # test file, the name lists, the README table, the registry-wide tests filtered to the new entry
    # and the Lightning layer (a smoke recipe generated from the registration, trained through the
    # CLI). Only the inductor compile is deselected: the copy's code is the focal loss's, which the
    # main suite compiles with inductor; the aot_eager and every other registry-wide check run.
    files = [f"tests/classification/test_{NEW}.py", "tests/test_names.py", "tests/test_readme.py",
             "tests/test_contract.py", "tests/test_contract_reliability.py", "tests/test_properties.py",
             "tests/test_module_repr.py", "tests/test_api_signatures.py", "tests/test_repository_hygiene.py",
             "tests/test_discovery.py", "tests/test_doctests.py",
             "tests/lightning/test_smoke_recipes.py", "tests/lightning/test_recipe_coverage.py"]
    select = (f"(test_{NEW}.py or test_names.py or test_loss_table_matches_registry or {NEW} or ProbeFocalLoss"
              f" or doctests_are_found) and not inductor")
    res = _run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rA", "-k", select,
                *files], tmp_path)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    passed = re.findall(r"^PASSED (\S+)", res.stdout, re.M)

    def ran(prefix: str) -> list:
        return [t for t in passed if t.startswith(prefix)]

    assert len(ran(f"tests/classification/test_{NEW}.py::")) >= 5, passed  # its own tests
    assert ran("tests/test_names.py::") and ran("tests/test_readme.py::test_loss_table_matches_registry")
    registry_wide = [t for t in passed if NEW in t and not t.startswith(("tests/classification/", "tests/lightning/"))]
    assert len(registry_wide) >= 25, registry_wide  # the entry's registry-wide checks ran
    assert ran("tests/lightning/test_smoke_recipes.py::") and ran("tests/lightning/test_recipe_coverage.py::"), passed
