"""One summary of every revision-3 claim: ``results/revision3/summary.md``.

Revision 3's claims are run in batches (one folder of ``results/revision3/`` per batch, each with
the ``summary.md`` that :mod:`reproduce_results` wrote from the batch's committed runs). This script
reads those summaries and the runs files beside them, and writes one page:

1. the counts of claims by their primary verdict, over every claim that has revision-3 runs;
2. one line per claim (the primary check, its CI, decidable or not, the verdict, the secondary checks
   and the flags such as *budget-limited*), with a link to the batch's full report;
3. the sanity checks, apart (never counted as reproductions);
4. the confidence table: for every arm of a claim whose evaluation runs recorded them, the mean over
   the evaluation seeds of accuracy, ECE, NLL, AURC and the out-of-distribution AUROCs (near OOD and
   uniform noise, by the maximum probability and by the energy score);
5. the claims of ``benchmarks/claims.yaml`` with no revision-3 runs yet.

Nothing is trained and no statistic is recomputed: the lines are the batches' own (a row whose
family, data and claim text no longer match the claims file is reported as stale, so a claim edited
after its runs cannot pass silently). ``--check`` compares the written page with the committed one
and fails when they differ (the test suite runs it).

Usage::

    python benchmarks/revision3_summary.py            # writes results/revision3/summary.md
    python benchmarks/revision3_summary.py --check    # exit 1 if the committed page is out of date
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from reproduce.claims import CLAIMS_FILE, load_claims  # noqa: E402
from reproduce.records import read_csv  # noqa: E402

RESULTS = os.path.join(ROOT, "results", "revision3")
#: folders of ``results/revision3`` that are not revision-3 runs (revision 2's runs read under its rules)
SKIP = ("on_revision2_runs",)
VERDICTS = ("reproduced", "contradicted", "not resolved", "invalid")
#: the confidence table's columns: (runs-file column, header)
CONFIDENCE = (("test/top1", "top-1"), ("test/ece", "ECE"), ("test/nll", "NLL"), ("test/aurc", "AURC"),
              ("test/ood_auroc_msp", "OOD near, MSP"), ("test/ood_auroc_energy", "OOD near, energy"),
              ("test/ood_noise_auroc_msp", "OOD noise, MSP"), ("test/ood_noise_auroc_energy", "OOD noise, energy"))


def _cells(line: str) -> List[str]:
    """The cells of a markdown table row (no cell of these tables holds a ``|``)."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def summaries(root: str = RESULTS) -> List[Tuple[str, str]]:
    """``(relative folder, path)`` of every batch summary: ``<folder>/summary.md`` and top-level
    ``<name>_summary.md`` (relative folder ``""``), sorted."""
    out = []
    for path in sorted(glob.glob(os.path.join(root, "*", "summary.md"))):
        folder = os.path.basename(os.path.dirname(path))
        if folder not in SKIP:
            out.append((folder, path))
    out += [("", p) for p in sorted(glob.glob(os.path.join(root, "*_summary.md")))]
    return out


def _relink(cell: str, folder: str) -> str:
    """``[x.md](x.md)`` -> ``[folder/x.md](folder/x.md)`` for a batch in a folder."""
    if not folder or "](" not in cell:
        return cell
    label, target = cell[1:].split("](", 1)
    return f"[{folder}/{label}]({folder}/{target}"


def parse_summary(path: str, folder: str) -> Tuple[List[List[str]], List[List[str]]]:
    """The claim rows (7 cells, the details link made relative to ``results/revision3``) and the
    sanity rows (4 cells) of one batch summary."""
    claims, sanity = [], []
    table = None
    with open(path) as fh:
        for line in fh:
            if not line.startswith("|"):
                table = None
                continue
            cells = _cells(line)
            if cells[0] == "family" and len(cells) == 7:
                table = "claims"
            elif cells[0] == "claim" and len(cells) == 4:
                table = "sanity"
            elif set(cells[0]) <= {"-"}:
                continue
            elif table == "claims":
                claims.append(cells[:6] + [_relink(cells[6], folder)])
            elif table == "sanity":
                sanity.append(cells)
    return claims, sanity


def _verdict_of(cell: str) -> str:
    """The counted verdict of a summary's verdict cell ("reproduced, but worse" counts as
    reproduced; "invalid (arm X did not train)" as invalid)."""
    low = cell.lower()
    for v in ("invalid", "not resolved", "contradicted", "reproduced"):
        if low.startswith(v):
            return v
    return cell


def runs_files(folder: str, summary_path: str) -> List[str]:
    """The runs files beside a batch summary: every ``*_runs.csv`` of its folder, or for a
    top-level ``<name>_summary.md`` its ``<name>_runs.csv`` (when it exists)."""
    if folder:
        return sorted(glob.glob(os.path.join(os.path.dirname(summary_path), "*_runs.csv")))
    path = summary_path[: -len("_summary.md")] + "_runs.csv"
    return [path] if os.path.exists(path) else []


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def confidence_cells(arm: str, rows: Sequence[dict]) -> Optional[List[str]]:
    """``[n, means of the :data:`CONFIDENCE` columns...]`` over ``arm``'s finished evaluation runs
    (``-`` where the runs have no value); ``None`` when they hold no confidence metric at all."""
    ev = [r for r in rows if r.get("arm") == arm and r.get("phase") == "eval" and r["ok"]]
    cells = []
    for col, _ in CONFIDENCE:
        vals = [float(r[col]) for r in ev if r.get(col) not in (None, "")]
        cells.append(f"{_mean(vals):.3f}" if vals else "-")
    if not ev or all(c == "-" for c in cells[1:]):
        return None
    return [str(len(ev))] + cells


def build(root: str = RESULTS, claims_file: str = CLAIMS_FILE) -> str:
    cf = load_claims(claims_file)
    by_text = {(c.family, c.data, c.claim): c for c in cf.claims}
    # a claim run again in a later batch (folders in name order, then the top-level summaries) takes
    # that batch's line, sanity rows and runs; the earlier batch stays as the record of its runs
    found: Dict[str, Tuple[List[str], str, str]] = {}  # claim key -> (row, folder, summary path)
    superseded: List[Tuple[str, str, str]] = []  # (claim key, earlier folder, later folder)
    stale: List[Tuple[str, List[str]]] = []
    sanity_by: Dict[Tuple[str, str], List[str]] = {}
    for folder, path in summaries(root):
        rows, san = parse_summary(path, folder)
        for r in san:
            sanity_by[(r[0], r[1])] = r
        for r in rows:
            c = by_text.get((r[0], r[1], r[2]))
            if c is None:
                stale.append((os.path.relpath(path, root), r))
                continue
            if c.key in found:
                superseded.append((c.key, found[c.key][1] or "(top level)", folder or "(top level)"))
            found[c.key] = (r, folder, path)
    sanity = list(sanity_by.values())
    conf: Dict[str, Tuple[List[str], List[str]]] = {}  # arm -> (its claims, cells)
    runs_of: Dict[str, List[dict]] = {}
    for c in cf.claims:
        if c.key not in found:
            continue
        _, folder, path = found[c.key]
        if path not in runs_of:
            runs_of[path] = [r for f in runs_files(folder, path) for r in read_csv(f)]
        for k in c.arms:  # the claim's own arms (not a difference-in-differences' clean arms)
            if k in conf:
                conf[k][0].append(c.key)
            elif (cells := confidence_cells(k, runs_of[path])) is not None:
                conf[k] = ([c.key], cells)
    counts = {v: 0 for v in VERDICTS}
    for r, _, _ in found.values():
        v = _verdict_of(r[4])
        counts[v] = counts.get(v, 0) + 1
    order = [c.key for c in cf.claims]
    sanity_keys = {r[0].strip("`") for r in sanity}
    sanity_only = [k for k in order if k in sanity_keys and k not in found]
    lines = [
        "# Revision 3: every claim run so far",
        "",
        "Generated by `python benchmarks/revision3_summary.py` from the batch summaries of this folder "
        "(each written by `benchmarks/reproduce_results.py` from the batch's committed runs; its header "
        "gives the command that regenerates it without training). Nothing here is recomputed: each line is "
        "its batch's own. A claim's verdict is its primary check's (paired 95% CI over seeds; docs/benchmarks.md, "
        "\"Protocol, revision 3\").",
        "",
        f"**{len(found)} of {len(cf.claims)} claims** have revision-3 runs: "
        + ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + "."
        + (f" {len(sanity_only)} sanity claim(s) (" + ", ".join(f"`{k}`" for k in sanity_only)
           + ") have runs too; they are never counted." if sanity_only else ""),
        "",
        "| family | data | claim | primary check: mean difference [CI], decidable at this n | verdict | "
        "secondary checks (Holm) | details |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(found[k][0]) + " |" for k in order if k in found]
    lines.append("")
    if superseded:
        lines += ["Claims run again in a later batch take that batch's line (the earlier batch's report stays as "
                  "the record of its runs): " + "; ".join(f"`{k}` ({a} -> {b})" for k, a, b in superseded) + ".", ""]
    if sanity:
        lines += ["Sanity checks (identities and levels met by construction; never counted as reproductions):", "",
                  "| claim | check | mean [CI] | result |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(r) + " |" for r in sanity]
        lines.append("")
    if conf:
        lines += [
            "## Confidence",
            "",
            "Per arm, the mean over its evaluation seeds (the test split; n runs): top-1 accuracy, expected "
            "calibration error (15 bins), negative log-likelihood (for a sparse mapping, of the probabilities "
            "clamped at 1e-12; its report gives the share of test targets at probability 0), the area under the "
            "risk-coverage curve (selective prediction by the maximum probability; lower is better) and the "
            "AUROC of telling in-distribution test images from out-of-distribution ones by the maximum "
            "probability (MSP) or the energy score (logsumexp of the logits): near OOD = scikit-learn's 8x8 "
            "digits upscaled, noise = uniform noise images. An AUROC below 0.5 means the arm is *more* confident "
            "on the OOD images than on its own test images, as networks with ReLU features are known to be far "
            "from the data, where the logits grow with the input's scale. Segmentation arms: ECE over pixels only; "
            "language-model arms: top-1 and the per-token NLL of the test tokens, unclamped (infinite for "
            "1.5-entmax, which gives some test tokens probability 0: its report gives the share).",
            "",
            "| arm | claims | n | " + " | ".join(h for _, h in CONFIDENCE) + " |",
            "|---|---|---|" + "---|" * len(CONFIDENCE),
        ]
        lines += [f"| {cf.arms[k].label if k in cf.arms else k} | " + ", ".join(f"`{x}`" for x in ks) + " | "
                  + " | ".join(cells) + " |" for k, (ks, cells) in conf.items()]
        lines.append("")
    missing = [c for c in cf.claims if c.key not in found and c.key not in sanity_keys]
    if missing:
        lines += ["## Not run under revision 3 yet", "",
                  "These claims' verdicts are still read from revision 2's runs under revision 3's rules "
                  "([on_revision2_runs/summary.md](on_revision2_runs/summary.md)):", ""]
        lines += [f"- `{c.key}` ({c.family}, {c.benchmark}): {c.claim}" for c in missing]
        lines.append("")
    if stale:
        lines += ["## Stale lines", "",
                  "Rows of a batch summary whose family, data or claim text no longer matches the claims file "
                  "(the claim was edited after its runs; re-run it):", ""]
        lines += [f"- `{p}`: {r[0]} / {r[1]} / {r[2]}" for p, r in stale]
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=RESULTS, help="the revision-3 results folder (default results/revision3)")
    p.add_argument("--claims-file", default=CLAIMS_FILE)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if <root>/summary.md differs")
    args = p.parse_args(argv)
    text = build(args.root, args.claims_file)
    target = os.path.join(args.root, "summary.md")
    if args.check:
        try:
            with open(target) as fh:
                old = fh.read()
        except FileNotFoundError:
            old = None
        if old != text:
            print(f"revision3_summary: {target} is out of date; run python benchmarks/revision3_summary.py",
                  file=sys.stderr)
            return 1
        print(f"revision3_summary: {target} is up to date")
        return 0
    with open(target, "w") as fh:
        fh.write(text)
    print(f"revision3_summary: wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
