"""MkDocs hook: generate the API reference pages from the packages' public names at build time.

A page under ``docs/api/`` holds a marker such as ``<!-- api:losses -->``; this hook replaces it by
one mkdocstrings directive (``::: module.name``) per public object, grouped by the module that
defines it. The lists come from ``losses.__all__``, ``losses.functional.__all__``, the registry and
the ``__all__`` of the :mod:`lightning_modules` packages, so a new public function, class or
registry entry appears in the reference without editing these pages (tests/test_repository_hygiene.py
checks it).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import warnings
from typing import Dict, List, Tuple

#: family page of each defining module (the API reference links back to the maths)
FAMILY_PAGES: Dict[str, Tuple[str, str]] = {
    "losses._core": ("Validation switch and warnings", "conventions.md"),
    "losses.classification.baselines": ("Baselines: cross-entropy and BCE", "losses/baselines.md"),
    "losses.classification.zloss": ("Z-loss and the log-Z penalty", "losses/z_loss.md"),
    "losses.classification.comp_sum": ("Comp-sum losses", "losses/comp_sum.md"),
    "losses.classification.adversarial": ("Smooth adversarial comp-sum (experimental)", "losses/adversarial_comp_sum.md"),
    "losses.classification.gol": ("GOL: Gumbel optimised loss", "losses/gol.md"),
    "losses.classification.sparsemax": ("Sparsemax, entmax-1.5 and bisection entmax", "losses/sparsemax.md"),
    "losses.classification.dice": ("Dice semimetric, Jaccard metric and soft Dice", "losses/dice.md"),
    "losses.embedding.linear_ce": ("Many-class linear cross-entropy", "losses/linear_cross_entropy.md"),
    "losses.embedding.opl": ("Orthogonal Projection Loss", "losses/opl.md"),
    "losses.embedding.nbc": ("NBC-softmax", "losses/nbc_softmax.md"),
    "losses.embedding.wcdas": ("WCDAS", "losses/wcdas.md"),
    "losses.embedding.margin": ("Margin softmax (ArcFace, CosFace, cosine softmax)", "losses/partial_fc.md"),
    "losses.embedding.partial_fc": ("Partial FC", "losses/partial_fc.md"),
    "losses.ranking.decoupled": ("Decoupled softmax, InfoNCE", "losses/decoupled_softmax.md"),
    "losses.ranking.soft_topk": ("Soft top-k", "losses/decoupled_softmax.md"),
    "losses.ranking.in_batch": ("In-batch scores", "losses/decoupled_softmax.md"),
    "losses.ranking.psl": ("PSL, sampled softmax and BPR", "losses/psl.md"),
}

#: names documented on the registry page instead of the losses page
REGISTRY_NAMES = ("LossSpec", "INPUT_KINDS", "create_loss", "get_loss_spec", "list_losses")

#: sub-packages of ``losses`` documented as a whole (listed if present, so parallel work shows up)
OPTIONAL_LOSS_PACKAGES = ("losses.integrations", "losses.testing")

LIGHTNING_PACKAGES = ("lightning_modules.models", "lightning_modules.data")
LIGHTNING_MODULES = ("lightning_modules.cli", "lightning_modules.base", "lightning_modules.optim",
                     "lightning_modules.routing", "lightning_modules.metrics", "lightning_modules.retrieval_metrics",
                     "lightning_modules.summary", "lightning_modules.progress", "lightning_modules.models.pretrained")


def _import(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def _defining_module(obj, default: str) -> str:
    mod = getattr(obj, "__module__", None)
    return mod if isinstance(mod, str) and mod else default


def losses_objects() -> List[Tuple[str, str]]:
    """``(canonical path, public name)`` of every object in ``losses.__all__`` shown on the losses page."""
    losses = _import("losses")
    out = []
    for name in losses.__all__:
        obj = getattr(losses, name)
        if name in REGISTRY_NAMES or inspect.ismodule(obj):
            continue
        out.append((f"{_defining_module(obj, 'losses')}.{name}", name))
    return out


def _directive(path: str, heading_level: int = 3, extra: str = "") -> str:
    opts = f"    options:\n      heading_level: {heading_level}\n{extra}"
    return f"::: {path}\n{opts}\n"


def losses_page() -> str:
    groups: Dict[str, List[str]] = {}
    for path, _ in losses_objects():
        groups.setdefault(path.rsplit(".", 1)[0], []).append(path)
    parts = []
    order = list(FAMILY_PAGES) + sorted(set(groups) - set(FAMILY_PAGES))
    for mod in order:
        if mod not in groups:
            continue
        title, page = FAMILY_PAGES.get(mod, (mod, None))
        parts.append(f"## {title}\n")
        if page:
            parts.append(f"Maths, defaults and results: [{page}](../{page}). Defined in `{mod}`.\n")
        if not mod.rsplit(".", 1)[-1].startswith("_"):  # the public module's own docstring
            parts.append(_directive(mod, 3, "      members: false\n      show_root_heading: false\n"))
        parts.extend(_directive(p) for p in groups[mod])
    for pkg in OPTIONAL_LOSS_PACKAGES:
        try:
            present = importlib.util.find_spec(pkg) is not None  # found, not imported
        except ImportError:
            present = False
        if not present:
            continue
        parts.append(f"## `{pkg}`\n")
        subs = _submodules(pkg)
        if not subs:  # a plain module (losses.testing): its public members right here
            parts.append(_directive(pkg, 3, "      filters: public\n"))
            continue
        parts.append(_directive(pkg, 3, "      members: false\n"))
        for sub in subs:  # one section per public sub-module (its classes and functions)
            parts.append(_directive(sub, 3, "      filters: public\n      show_root_full_path: true\n"))
    return "\n".join(parts)


def _submodules(pkg: str) -> List[str]:
    """The sub-modules a package names in its ``__all__`` (found, not imported beyond the package)."""
    names = getattr(_import(pkg), "__all__", ())
    out = []
    for name in names:
        try:
            if importlib.util.find_spec(f"{pkg}.{name}") is not None:
                out.append(f"{pkg}.{name}")
        except ImportError:
            continue
    return out


def functional_page() -> str:
    functional = _import("losses.functional")
    rows = ["| function | defined in |", "|---|---|"]
    for name in functional.__all__:
        obj = getattr(functional, name)
        mod = _defining_module(obj, "losses.functional")
        rows.append(f"| [`{name}`][{mod}.{name}] | `{mod}` |")
    return "\n".join(rows) + "\n"


def registry_page() -> str:
    parts = [_directive(f"losses._registry.{n}") for n in REGISTRY_NAMES]
    losses = _import("losses")
    rows = ["| registry name | function and module | inputs | unit | family |", "|---|---|---|---|---|"]
    for spec in losses.list_losses():
        fmod = _defining_module(spec.function, "losses")
        mmod = _defining_module(spec.module, "losses")
        title, page = FAMILY_PAGES.get(mmod, (None, None))
        link = f"[{title}](../{page})" if page else "—"
        rows.append(
            f"| `{spec.name}` | [`{spec.function.__name__}`][{fmod}.{spec.function.__name__}], "
            f"[`{spec.module.__name__}`][{mmod}.{spec.module.__name__}] | {spec.kind} | "
            f"{spec.unit} | {link} |"
        )
    kinds = ", ".join(f"{k} = `({', '.join(v)})`" for k, v in losses.INPUT_KINDS.items())
    # the class keeps the names in one piece (docs/assets/stylesheets/extra.css); md_in_html renders the table inside
    table = '<div class="registry-table" markdown>\n\n' + "\n".join(rows) + "\n\n</div>"
    return "## Registered losses\n\nInput kinds: " + kinds + ".\n\n" + table + "\n\n" + "\n".join(parts)


def lightning_objects() -> List[str]:
    paths = []
    for pkg_name in LIGHTNING_PACKAGES:
        pkg = _import(pkg_name)
        for name in pkg.__all__:
            obj = getattr(pkg, name)
            paths.append(f"{_defining_module(obj, pkg_name)}.{name}")
    return paths


def lightning_page() -> str:
    parts = ["## Entry point and shared base classes\n"]
    parts += [_directive(m, 3, "      filters: public\n      show_root_full_path: true\n")
              for m in LIGHTNING_MODULES]
    parts.append("## LightningModules and DataModules\n")
    seen = set()
    for path in lightning_objects():
        if path in seen:
            continue
        seen.add(path)
        parts.append(_directive(path))
    return "\n".join(parts)


GENERATORS = {
    "losses": losses_page,
    "functional": functional_page,
    "registry": registry_page,
    "lightning_modules": lightning_page,
}

_MARKER = re.compile(r"<!--\s*api:(\w+)\s*-->")


def on_page_markdown(markdown: str, page=None, config=None, files=None) -> str:
    return _MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)
