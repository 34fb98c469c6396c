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

    # its own test file, the name lists, and the registry-wide tests filtered to the new entry
    pytest_args = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                   f"tests/classification/test_{NEW}.py", "tests/test_names.py",
                   "tests/test_readme.py::test_loss_table_matches_registry"]
    res = _run(pytest_args, tmp_path)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    filtered = ["tests/test_contract.py", "tests/test_contract_reliability.py", "tests/test_properties.py",
                "tests/test_module_repr.py", "tests/test_api_signatures.py", "tests/test_repository_hygiene.py",
                "tests/test_discovery.py", "tests/test_doctests.py"]
    res = _run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k",
                f"{NEW} or ProbeFocalLoss or doctests_are_found", *filtered], tmp_path)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    ran = re.search(r"(\d+) passed", res.stdout)
    assert ran and int(ran.group(1)) >= 25, res.stdout[-2000:]  # the entry's registry-wide checks ran

    # the Lightning layer: a smoke recipe generated from the registration, trained through the CLI
    res = _run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", NEW,
                "tests/lightning/test_smoke_recipes.py", "tests/lightning/test_recipe_coverage.py"], tmp_path)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    ran = re.search(r"(\d+) passed", res.stdout)
    assert ran and int(ran.group(1)) >= 2, res.stdout[-2000:]
