"""MkDocs hook: generate the API reference pages from the packages' public names at build time.

A page under ``docs/api/`` holds a marker such as ``<!-- api:losses -->``; this hook replaces it by
one mkdocstrings directive (``::: module.name``) per public object, grouped by the module that
defines it. The lists come from ``losses.__all__``, ``losses.functional.__all__``, the registry and
the ``__all__`` of the :mod:`lightning_modules` packages, so a new public function, class or
registry entry appears in the reference without editing these pages (tests/test_repository_hygiene.py
checks it).

Loss family pages: a module that defines a registered loss and has a hand-written page (mapped in
:data:`FAMILY_PAGES`) links to it; any other gets a page generated from its docstrings and its
registry records (:func:`generated_family_pages`), added to the site's files and, like every page
under ``docs/losses/`` missing from ``mkdocs.yml``, to the "Loss families" section of the
navigation. A new loss therefore reaches the site from its registration alone.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import warnings
from typing import Dict, List, Tuple

#: the hand-written family page of a defining module (the API reference links back to the maths);
#: a module without one gets a generated page (:func:`family_pages`)
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
    "losses.embedding.vocab_parallel": ("Vocabulary-parallel linear cross-entropy", "losses/linear_cross_entropy.md"),
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
                     "lightning_modules.routing", "lightning_modules.metrics", "lightning_modules.lm_metrics",
                     "lightning_modules.retrieval_metrics", "lightning_modules.records",
                     "lightning_modules.attacks",
                     "lightning_modules.summary", "lightning_modules.progress", "lightning_modules.recipes",
                     "lightning_modules.models.pretrained")


#: the navigation section that lists the loss family pages
FAMILY_SECTION = "Loss families"
_DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the latest benchmark summary; its confidence table names every arm and the claims it ran in
_SUMMARY = os.path.join(os.path.dirname(_DOCS), "results", "revision3", "summary.md")
#: the arm labels of the benchmark reports (their beginning) that are a registry entry's runs, for
#: the generated pages' "Measured" section
ARM_ENTRIES: Tuple[Tuple[str, str], ...] = (
    ("logit-adjusted CE", "logit_adjusted"),
    ("balanced softmax", "balanced_softmax"),
    ("focal", "focal"),
)


def measured_section(names: List[str]) -> str:
    """Markdown "Measured" section of a generated family page: the rows of the latest summary's
    confidence table whose arm runs one of ``names`` (registry names), each claim linked to the
    hand-written family page that reports it; empty when no arm does."""
    if not os.path.isfile(_SUMMARY):
        return ""
    with open(_SUMMARY, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("| arm | claims |")), None)
    if start is None:
        return ""
    header = lines[start]
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip().strip("|").split(" | ")]
        if any(cells[0].startswith(prefix) and name in names for prefix, name in ARM_ENTRIES):
            rows.append(cells)
    if not rows:
        return ""
    stems = sorted((os.path.splitext(n)[0] for n in os.listdir(os.path.join(_DOCS, "losses")) if n.endswith(".md")),
                   key=len, reverse=True)

    def claim_link(cid: str) -> str:
        stem = next((st for st in stems if cid == st or cid.startswith(st + "_")), None)
        return f"[`{cid}`]({stem}.md#measured)" if stem else f"`{cid}`"

    for cells in rows:
        cells[1] = ", ".join(claim_link(c) for c in re.findall(r"`(\w+)`", cells[1]))
    cols = [c.strip() for c in header.strip().strip("|").split(" | ")]
    table = [header, "|" + "---|" * len(cols)] + ["| " + " | ".join(c) + " |" for c in rows]
    return ("## Measured\n\nIn the benchmark (protocol revision 3) this loss ran as a baseline arm of "
            "the claims linked below; each claim's verdict, its checks against this arm and the "
            "accuracy numbers are on that family page. The confidence of each arm, means over its "
            "evaluation seeds, from [the summary](../results/revision3/summary.md#confidence):\n\n"
            + "\n".join(table) + "\n")


def _rst_rewrite():
    """``rewrite`` of the griffe extension (docstring reST idioms -> Markdown), loaded by path."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "griffe_rst.py")
    spec = importlib.util.spec_from_file_location("_docs_griffe_rst", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.rewrite


def _first_line(doc: str) -> str:
    """A module docstring's first line as a navigation title: plain text, because the navigation
    shows titles as text (backticks and reST roles would show raw there; the page's own heading
    keeps them as code, :func:`_heading`), and only the name before a colon."""
    line = _heading(doc)
    line = re.sub(r"`+([^`]*)`+", r"\1", line)
    name, sep, _ = line.partition(": ")  # "Focal loss: what it does" -> "Focal loss" (short in the nav)
    if sep and 0 < len(name) <= 40:
        line = name
    return line or "Loss family"


def _heading(doc: str) -> str:
    """A module docstring's first paragraph (its summary) as the page's Markdown heading (code
    spans kept)."""
    line = " ".join(inspect.cleandoc(doc or "").split("\n\n", 1)[0].split())  # the first paragraph
    line = re.sub(r"\s*\(docs/[^)]*\)", "", line)  # a pointer to a docs page, in brackets
    line = _rst_rewrite()(line).replace("``", "`")
    return line.rstrip(".") or "Loss family"


def _after_heading(doc: str) -> str:
    """The module docstring without its first paragraph (the page's heading, :func:`_heading`)."""
    return inspect.cleandoc(doc or "").partition("\n\n")[2].strip()


def _google(text: str) -> str:
    """``google_sections`` of the griffe extension, loaded by path."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "griffe_rst.py")
    spec = importlib.util.spec_from_file_location("_docs_griffe_rst", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.google_sections(text)


def generated_family_pages() -> Dict[str, Tuple[str, str, str]]:
    """``module -> (title, page path under docs/, Markdown)`` for every module that defines a
    registered loss and has no hand-written page: the module's docstring, a table of its registry
    records and the links to its API entries."""
    losses = _import("losses")
    by_module: Dict[str, list] = {}
    for spec in losses.list_losses():
        mod = _defining_module(spec.module, "losses")
        if mod not in FAMILY_PAGES:
            by_module.setdefault(mod, []).append(spec)
    if not by_module:
        return {}
    rewrite = _rst_rewrite()
    out = {}
    for mod, specs in sorted(by_module.items()):
        module = _import(mod)
        title = _first_line(module.__doc__)
        page = f"losses/{mod.rsplit('.', 1)[-1]}.md"
        rows = ["| registry name | function and module | inputs | unit | paper |", "|---|---|---|---|---|"]
        for spec in specs:
            fmod = _defining_module(spec.function, "losses")
            paper = spec.paper + (f" ([arXiv {spec.arxiv}](https://arxiv.org/abs/{spec.arxiv}))" if spec.arxiv else "")
            rows.append(f"| `{spec.name}` | [`{spec.function.__name__}`][{fmod}.{spec.function.__name__}], "
                        f"[`{spec.module.__name__}`][{mod}.{spec.module.__name__}] | {spec.kind} | {spec.unit} | "
                        f"{paper} |")
        body = [f"# {_heading(module.__doc__)}\n",
                "*This page is generated from the docstrings and the registry records of "
                f"`{mod}`; the API entries are in the [API reference](../api/losses.md).*\n",
                rewrite(_after_heading(module.__doc__)) + "\n",
                "## Registered losses\n", "\n".join(rows) + "\n"]
        for spec in specs:
            body.append(f"## `{spec.name}`\n")
            body.append(rewrite(_google(inspect.cleandoc(spec.function.__doc__ or ""))) + "\n")
        measured = measured_section([spec.name for spec in specs])
        if measured:
            body.append(measured)
        out[mod] = (title, page, "\n".join(body))
    return out


def family_pages() -> Dict[str, Tuple[str, str]]:
    """``module -> (title, page)`` of every family: the hand-written pages and the generated ones."""
    pages = dict(FAMILY_PAGES)
    pages.update({mod: (title, page) for mod, (title, page, _) in generated_family_pages().items()})
    return pages


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
    pages = family_pages()
    order = list(pages) + sorted(set(groups) - set(pages))
    for mod in order:
        if mod not in groups:
            continue
        title, page = pages.get(mod, (mod, None))
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
    pages = family_pages()
    for spec in losses.list_losses():
        fmod = _defining_module(spec.function, "losses")
        mmod = _defining_module(spec.module, "losses")
        title, page = pages.get(mmod, (None, None))
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


def _nav_pages(nav) -> List[str]:
    out: List[str] = []
    for item in nav or []:
        value = item if isinstance(item, str) else next(iter(item.values())) if isinstance(item, dict) else None
        if isinstance(value, list):
            out += _nav_pages(value)
        elif isinstance(value, str):
            out.append(value)
    return out


def nav_additions(nav) -> List[Tuple[str, str]]:
    """``(title, page)`` to append to the "Loss families" section: the generated family pages and
    any hand-written ``docs/losses/*.md`` page the configured navigation does not list yet."""
    listed = set(_nav_pages(nav))
    extra = []
    for title, page, _ in generated_family_pages().values():
        if page not in listed:
            extra.append((title, page))
    folder = os.path.join(_DOCS, "losses")
    for fname in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        page = f"losses/{fname}"
        if fname.endswith(".md") and page not in listed and page not in {p for _, p in extra}:
            with open(os.path.join(folder, fname), encoding="utf-8") as fh:
                head = re.sub(r"`+([^`]*)`+", r"\1", fh.readline().lstrip("# ").strip())
            extra.append((head or fname[:-3], page))
    return extra


def on_config(config):
    """Append the family pages the navigation does not list to its "Loss families" section."""
    nav = config.get("nav")
    if not nav:
        return config
    extra = nav_additions(nav)
    if not extra:
        return config
    for item in nav:
        if isinstance(item, dict) and FAMILY_SECTION in item and isinstance(item[FAMILY_SECTION], list):
            item[FAMILY_SECTION].extend({title: page} for title, page in extra)
            break
    else:
        nav.append({FAMILY_SECTION: [{title: page} for title, page in extra]})
    return config


def on_files(files, config):
    """Add the generated family pages to the site's files."""
    from mkdocs.structure.files import File

    for _, page, markdown in generated_family_pages().values():
        if files.get_file_from_path(page) is None:
            files.append(File.generated(config, page, content=markdown))
    return files
