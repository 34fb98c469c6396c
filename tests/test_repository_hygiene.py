"""The repository is self-contained and its documentation pointers are true.

* No tracked file, the generated reports under ``results/`` included, points to documents that are
  not in the repository: the design documents the project was started from, a parent ``shared``
  folder, section signs or issue numbers.
* Every ``docs/<...>.md`` path mentioned anywhere in the repository exists.
* Every registry entry (``losses.list_losses()``) has a family page under ``docs/losses/`` that
  names it, and its function and module appear in the generated API reference.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess

import pytest
import yaml

import losses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Built from pieces so that this file does not match its own patterns.
_FORBIDDEN = [
    re.compile(re.escape(".." + "/shared")),
    re.compile(r"\b(?:" + "|".join(("LOSSES", "BENCHMARKS", "ARCHITECTURE")) + r")\.md"),
    re.compile("\u00a7"),
    re.compile(r"\bissue[- ]?#?[0-9]", re.IGNORECASE),
]
_DOCS_PATH = re.compile(r"\bdocs/[A-Za-z0-9_][A-Za-z0-9_./-]*?\.md\b")
_SKIP_DIRS = {".git", ".venv", "build", "dist", "site", "__pycache__", ".pytest_cache", "lightning_logs",
              "outputs", "data_cache", ".cache"}


def _tracked_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
        files = [f for f in out.stdout.decode().split("\0") if f]
        if files:
            return files
    except (OSError, subprocess.SubprocessError):
        pass
    files = []  # not a git checkout: walk the tree
    for dirpath, dirnames, names in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        files += [os.path.relpath(os.path.join(dirpath, n), ROOT) for n in names]
    return files


def _texts(include_results: bool):
    for rel in _tracked_files():
        rel = rel.replace(os.sep, "/")
        if not include_results and rel.startswith("results/"):
            continue
        path = os.path.join(ROOT, rel)
        if not os.path.isfile(path):
            continue  # deleted in the working tree
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:
            continue  # binary (plots, checkpoints)
        yield rel, data.decode("utf-8", errors="replace")


def test_no_pointers_outside_the_repository():
    hits = []
    for rel, text in _texts(include_results=True):
        for lineno, line in enumerate(text.splitlines(), 1):
            for pat in _FORBIDDEN:
                if pat.search(line):
                    hits.append(f"{rel}:{lineno}: {line.strip()[:160]}")
    assert not hits, "references to documents outside the repository:\n" + "\n".join(hits)


def test_every_mentioned_docs_page_exists():
    missing = {}
    for rel, text in _texts(include_results=True):
        for m in _DOCS_PATH.finditer(text):
            if not os.path.isfile(os.path.join(ROOT, m.group(0))):
                missing.setdefault(m.group(0), rel)
    assert not missing, "docs pages that are mentioned but do not exist: " + ", ".join(
        f"{page} (in {where})" for page, where in sorted(missing.items()))


def _api_pages():
    path = os.path.join(ROOT, "docs", "_hooks", "api_pages.py")
    spec = importlib.util.spec_from_file_location("_docs_api_pages", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("spec", losses.list_losses(), ids=lambda s: s.name)
def test_registry_entry_has_family_page_and_api_entry(spec):
    api = _api_pages()
    documented = {path for path, _ in api.losses_objects()}
    for obj in (spec.function, spec.module):
        assert obj.__name__ in losses.__all__, f"{spec.name}: {obj.__name__} is not in losses.__all__"
        assert f"{obj.__module__}.{obj.__name__}" in documented, f"{spec.name}: {obj.__name__} missing from the API reference"
    title_page = api.family_pages().get(spec.module.__module__)
    assert title_page, f"{spec.name}: no family page for {spec.module.__module__} (docs/_hooks/api_pages.py)"
    generated = api.generated_family_pages()
    if spec.module.__module__ in generated:  # no hand-written page: one generated from the docstrings
        text = generated[spec.module.__module__][2]
        assert not os.path.isfile(os.path.join(ROOT, "docs", title_page[1])), title_page[1]
    else:
        page = os.path.join(ROOT, "docs", title_page[1])
        assert os.path.isfile(page), f"{spec.name}: {title_page[1]} does not exist"
        with open(page, encoding="utf-8") as f:
            text = f.read()
    assert f"`{spec.name}`" in text, f"{spec.name}: its family page {title_page[1]} does not name it"
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        nav = yaml.safe_load(f.read().replace("!!python", "!python"))["nav"]
    in_nav = title_page[1] in api._nav_pages(nav) or title_page[1] in {p for _, p in api.nav_additions(nav)}
    assert in_nav, f"{spec.name}: {title_page[1]} is neither in the mkdocs.yml nav nor added by the hook"


def test_api_pages_cover_the_public_names():
    api = _api_pages()
    documented = {name for _, name in api.losses_objects()}
    documented |= set(api.REGISTRY_NAMES)
    public = {n for n in losses.__all__ if not isinstance(getattr(losses, n), type(os))}
    assert public <= documented, f"not in the API reference: {sorted(public - documented)}"
