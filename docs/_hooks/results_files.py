"""MkDocs hook: publish the committed ``results/`` directory (generated reports, plots, CSVs) as
part of the site under ``results/``, so the pages link and embed the measured numbers and plots
without copying them into ``docs/``. The files are written only by the benchmark scripts
(``benchmarks/reproduce_results.py``, ``benchmarks/perf_losses.py``).

The reports stay out of the navigation (``not_in_nav: /results/`` in ``mkdocs.yml``): the page
``docs/results.md`` holds the marker ``<!-- results:reports -->``, which this hook replaces by an
index of every report under ``results/`` (grouped by folder, each with the title below or, for a
report not listed there yet, its folder and first heading), so a new report is linked without
editing any page.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Tuple

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTENSIONS = (".md", ".png", ".csv")

#: the index's title of a report (the navigation's titles before the reports left it)
REPORT_TITLES: Dict[str, str] = {
    "results/revision2/summary.md": "Revision 2: summary",
    "results/revision2/vision.md": "Revision 2: vision",
    "results/revision2/segmentation.md": "Revision 2: segmentation",
    "results/revision2/recommendation.md": "Revision 2: recommendation",
    "results/revision2/retrieval.md": "Revision 2: retrieval",
    "results/revision2/many_class.md": "Revision 2: many classes",
    "results/revision2/many_class_ddp.md": "Revision 2: many classes, DDP run",
    "results/revision3/summary.md": "Revision 3: every claim run so far (summary, confidence)",
    "results/revision3/README.md": "Revision 3: runs so far",
    "results/revision4/README.md": "Revision 4: runs so far",
    "results/revision4/summary.md": "Revision 4: summary",
    "results/revision4/many_class.md": "Revision 4: many classes (Partial FC, sampled-centre update)",
    "results/revision3/on_revision2_runs/summary.md": "Revision 3 rules on revision 2's runs: summary",
    "results/revision3/on_revision2_runs/vision.md": "Revision 3 rules on revision 2's runs: vision",
    "results/revision3/on_revision2_runs/segmentation.md": "Revision 3 rules on revision 2's runs: segmentation",
    "results/revision3/on_revision2_runs/recommendation.md": "Revision 3 rules on revision 2's runs: recommendation",
    "results/revision3/on_revision2_runs/retrieval.md": "Revision 3 rules on revision 2's runs: retrieval",
    "results/revision3/on_revision2_runs/many_class.md": "Revision 3 rules on revision 2's runs: many classes",
    "results/revision3/vision/vision.md": "Revision 3: vision (Z-loss, sparsemax, 1.5-entmax, OPL)",
    "results/revision3/vision/summary.md": "Revision 3: vision summary",
    "results/revision3/adversarial/vision.md": "Revision 3: adversarial (MNIST-5k, PGD at eps 0.1)",
    "results/revision3/adversarial/summary.md": "Revision 3: adversarial summary",
    "results/revision3/comp_sum/vision.md": "Revision 3: comp-sum (label noise)",
    "results/revision3/comp_sum/summary.md": "Revision 3: comp-sum (label noise), summary",
    "results/revision3/gol/vision.md": "Revision 3: GOL (long tail)",
    "results/revision3/gol/summary.md": "Revision 3: GOL (long tail), summary",
    "results/revision3/wcdas/vision.md": "Revision 3: WCDAS (long tail)",
    "results/revision3/wcdas/summary.md": "Revision 3: WCDAS (long tail), summary",
    "results/revision3/long_tail_2stage/vision.md": "Revision 3: GOL and WCDAS, two stages (long tail)",
    "results/revision3/long_tail_2stage/summary.md": "Revision 3: GOL and WCDAS, two stages, summary",
    "results/revision3/retrieval_stdlib/retrieval.md": "Revision 3: decoupled softmax = InfoNCE (stdlib, sanity)",
    "results/revision3/retrieval_stdlib/summary.md": "Revision 3: decoupled softmax = InfoNCE, summary",
    "results/revision3/many_class/many_class.md": "Revision 3: many classes (Partial FC CosFace)",
    "results/revision3/many_class/summary.md": "Revision 3: many classes summary",
    "results/revision3/many_class_arcface/many_class.md": "Revision 3: many classes (Partial FC ArcFace)",
    "results/revision3/many_class_arcface/summary.md": "Revision 3: many classes (ArcFace) summary",
    "results/revision3/recommendation/recommendation.md": "Revision 3: recommendation (ML-100k)",
    "results/revision3/recommendation/summary.md": "Revision 3: recommendation summary",
    "results/revision3/psl/recommendation.md": "Revision 3: PSL (ML-100k)",
    "results/revision3/psl/summary.md": "Revision 3: PSL summary",
    "results/revision3/psl_false_negatives/recommendation.md": "Revision 3: PSL under false negatives",
    "results/revision3/psl_false_negatives/summary.md": "Revision 3: PSL under false negatives, summary",
    "results/revision3/retrieval/retrieval.md": "Revision 3: retrieval (chatterbot, stdlib)",
    "results/revision3/retrieval/summary.md": "Revision 3: retrieval summary",
    "results/revision3/segmentation/segmentation.md": "Revision 3: segmentation (Jaccard, Dice semimetric)",
    "results/revision3/segmentation/summary.md": "Revision 3: segmentation summary",
    "results/revision3/language_model.md": "Revision 3: language model",
    "results/revision3/language_model_summary.md": "Revision 3: language model, summary",
    "results/revision3/widening/summary.md": "Revision 3, widened grids (16 claims): summary",
    "results/revision3/widening/vision.md": "Revision 3, widened grids: vision",
    "results/revision3/widening/recommendation.md": "Revision 3, widened grids: recommendation",
    "results/revision3/widening/retrieval.md": "Revision 3, widened grids: retrieval",
    "results/summary.md": "Summary",
    "results/vision.md": "Vision",
    "results/segmentation.md": "Segmentation",
    "results/recommendation.md": "Recommendation",
    "results/retrieval.md": "Retrieval",
    "results/perf/targets.md": "Performance targets",
    "results/perf/targets_verdicts.md": "Performance targets (verdicts)",
    "results/perf/losses.md": "Performance of every loss",
    "results/perf/peers.md": "Performance beside peer libraries",
    "results/perf/compiled.md": "Performance under torch.compile",
    "results/perf/lm_head.md": "Language-model head (many classes)",
    "results/perf/profile.md": "Operator profiles",
    "results/perf/partial_fc.md": "Partial FC and the optimiser step",
    "results/perf/sparsemax_paths.md": "Sparsemax: k=None vs a given k",
    "results/perf/sparsemax_search_forced.md": "Sparsemax: each exact search forced",
    "results/perf/sparsemax_entmax_bound.md": "Sparsemax / entmax-1.5: what bounds the step",
    "results/perf/dice_precision.md": "Dice: float32 precision beside MONAI",
    "results/perf/epyc/README.md": "Performance targets on an AMD EPYC",
    "results/perf/epyc/targets_verdicts.md": "EPYC targets (verdicts)",
    "results/perf/epyc/targets.md": "EPYC targets (table)",
    "results/perf/epyc/targets_verdicts_before.md": "EPYC targets before the CPU row kernel",
    "results/perf/gpu/gpu.md": "GPU kernels side by side (H200)",
    "results/perf/gpu/configs.md": "GPU: the row kernels' block sizes",
    "results/perf/gpu/device_small.md": "GPU: every logits loss at small batches",
}

#: the index's groups, in order: (title, folder prefix); a report goes to the first that matches
GROUPS: Tuple[Tuple[str, str], ...] = (
    ("Revision 3: every claim and the runs", "results/revision3/summary.md"),
    ("Revision 3: every claim and the runs", "results/revision3/README.md"),
    ("Revision 3: batch reports", "results/revision3/"),
    ("Revision 2", "results/revision2/"),
    ("Performance", "results/perf/"),
    ("First protocol", "results/"),
)

_MARKER = re.compile(r"<!--\s*results:reports\s*-->")


def report_paths() -> List[str]:
    """Every Markdown report under ``results/``, as ``results/...`` paths, sorted."""
    out = []
    for dirpath, _, names in os.walk(os.path.join(ROOT, "results")):
        for name in names:
            if name.endswith(".md"):
                out.append(os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/"))
    return sorted(out)


def _title(path: str) -> str:
    if path in REPORT_TITLES:
        return REPORT_TITLES[path]
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        head = next((ln for ln in f if ln.startswith("# ")), "")
    head = head[2:].strip().replace("`", "") or os.path.basename(path)
    return f"{os.path.dirname(path)[len('results/'):] or 'results'}: {head}"


def reports_index(page_dir: str = "") -> str:
    """The Markdown index of every report, links relative to a page in ``page_dir`` of ``docs/``."""
    groups: Dict[str, List[str]] = {}
    known = list(REPORT_TITLES)
    for path in sorted(report_paths(), key=lambda p: (known.index(p) if p in known else len(known), p)):
        group = next(title for title, prefix in GROUPS if path == prefix or
                     (prefix.endswith("/") and path.startswith(prefix)))
        groups.setdefault(group, []).append(path)
    prefix = "../" * (page_dir.count("/") + 1) if page_dir else ""
    parts = []
    for title in dict.fromkeys(t for t, _ in GROUPS):
        if title not in groups:
            continue
        parts.append(f"**{title}**\n")
        parts += [f"- [{_title(p)}]({prefix}{p})" for p in groups[title]]
        parts.append("")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page=None, config=None, files=None) -> str:
    if not _MARKER.search(markdown):
        return markdown
    page_dir = os.path.dirname(page.file.src_uri) if page is not None else ""
    index = reports_index(page_dir)
    return _MARKER.sub(lambda m: index, markdown)


def on_files(files, config, **kwargs):
    results = os.path.join(ROOT, "results")
    for dirpath, _, names in os.walk(results):
        for name in sorted(names):
            if not name.endswith(EXTENSIONS):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/")
            if files.get_file_from_path(rel) is None:
                files.append(File(rel, src_dir=ROOT, dest_dir=config["site_dir"],
                                  use_directory_urls=config["use_directory_urls"]))
    return files
