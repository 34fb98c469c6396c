"""The documentation follows the evidence: the pages that recommend losses or name measured verdicts
agree with the registry and with the latest committed results.

**The citation convention.** A page names a benchmark verdict only as a *claim citation*:

    **<verdict>** ([revision <N>, `<claim id>`](<link to the report section>))
    **<verdict>** ([revision <N>, `<claim id>`: <check>](<link to the report section>))

``<verdict>`` is ``reproduced``, ``contradicted`` or ``not resolved`` (or, for a claim's verdict,
``invalid``: an arm stayed under its competence floor); the first form is the claim's
verdict (its primary check's), the second one check's, ``<check>`` copied from the report's check
table (``acc_tail: GOL (LT) > logit-adjusted CE (LT)``). The link points at the claim's section of
the report the summary names. ``revision 3`` is checked against ``results/revision3/summary.md``
(with, for a claim it lists as not run under revision 3 yet, the line of
``results/revision3/on_revision2_runs/summary.md``); ``revision 2`` against
``results/revision2/summary.md``; ``revision 4`` (the claims re-declared under it, one at a time)
against ``results/revision4/summary.md``. Every other verdict word on a checked page (outside the history
sections of a family page) is an error, a revision-2 citation of a claim with a revision-3 line
must come after that claim's revision-3 citation, and every claim of the latest results is cited
on its family page.

``docs/choosing.md`` in addition names every registry entry, cites a report for every measured
number it quotes (the number is in the cited section), leads its long-tail row with the losses the
long-tail claims measured best, and has a language-model row. ``docs/conventions.md``'s unit table
lists every registry entry in the row of its registry ``unit``.

The last tests feed the checker pages with a wrong verdict, an uncited verdict, a wrong anchor and a
revision-2-only citation and see each one fail.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Dict, List, Optional, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
RESULTS = os.path.join(ROOT, "results")
LATEST = os.path.join(RESULTS, "revision3", "summary.md")
ON_REV2 = os.path.join(RESULTS, "revision3", "on_revision2_runs", "summary.md")
SUMMARIES = {"2": os.path.join(RESULTS, "revision2", "summary.md"), "3": LATEST,
             "4": os.path.join(RESULTS, "revision4", "summary.md")}

VERDICTS = ("reproduced", "contradicted", "not resolved")
#: a claim's verdict when an arm did not clear its competence floor (a citation may name it; as a word
#: it is ordinary English, so an uncited "invalid" is not read as a verdict)
INVALID = "invalid"
_VERDICT_WORD = re.compile(r"\b(reproduced|contradicted|not resolved)\b", re.I)
_BOLD_VERDICT = re.compile(r"\*\*(reproduced|contradicted|not resolved)\*\*")
CITATION = re.compile(
    r"\*\*(?P<verdict>(?:reproduced|contradicted|not resolved|invalid)(?: at this budget)?)\*\* "
    r"\(\[revision (?P<rev>[234]), `(?P<claim>\w+)`(?:: (?P<check>[^\]]+))?\]"
    r"\((?P<link>[^)\s]+)\)\)"
)
#: a measured number: a decimal with a point (hyperparameters are written in maths or code)
_NUMBER = re.compile(r"(?<![\w.])[+\-−]?\d+\.\d+")

#: family page of every claim of the latest results (a new claim fails the coverage test until
#: it is mapped here and cited on its page)
CLAIM_PAGES = {
    "z_loss": "losses/z_loss.md", "z_loss_topk": "losses/z_loss.md", "z_loss_lm": "losses/z_loss.md",
    "logz_penalty_lm": "losses/z_loss.md", "logz_penalty_lm_high_lr": "losses/z_loss.md",
    "sparsemax": "losses/sparsemax.md", "entmax15": "losses/sparsemax.md", "entmax15_lm": "losses/sparsemax.md",
    "comp_sum": "losses/comp_sum.md", "adversarial": "losses/adversarial_comp_sum.md", "opl": "losses/opl.md",
    "gol": "losses/gol.md", "gol_2stage": "losses/gol.md", "gol_items": "losses/gol.md",
    "wcdas": "losses/wcdas.md", "wcdas_2stage": "losses/wcdas.md",
    "dice": "losses/dice.md", "jaccard": "losses/dice.md",
    "psl": "losses/psl.md", "psl_popularity_shift": "losses/psl.md", "psl_false_negatives": "losses/psl.md",
    "decoupled_softmax_users": "losses/decoupled_softmax.md",
    "decoupled_softmax_chatterbot": "losses/decoupled_softmax.md",
    "soft_topk_chatterbot": "losses/decoupled_softmax.md", "nbc_softmax": "losses/nbc_softmax.md",
    "partial_fc_ml100k": "losses/partial_fc.md", "pfc_arcface": "losses/partial_fc.md",
    "pfc_cosface": "losses/partial_fc.md", "pfc_cosface_c1e5": "losses/partial_fc.md",
}
#: the long-tail claims and the registry entry of each arm label's loss (longest prefix first)
LONG_TAIL_CLAIMS = ("gol", "gol_2stage", "wcdas", "wcdas_2stage")
ARM_LOSSES = (("logit-adjusted CE", "logit_adjusted"), ("balanced softmax", "balanced_softmax"),
              ("cosine softmax", "cosine_softmax"), ("cross-entropy", "cross_entropy"),
              ("BCE", "bce_with_logits"), ("GOL", "gol"), ("WCDAS", "wcdas"))
#: history sections of a family page, where earlier protocols' words stand as they were
HISTORY_HEADING = re.compile(r"^#{2,4} .*(earlier|history|first protocol|revision 2)", re.I)


# --- the results files --------------------------------------------------------------------------

def _table_rows(text: str, header_start: str) -> List[List[str]]:
    """The rows (cells stripped) of the first Markdown table whose header row starts with ``header_start``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split(" | ")])
            return rows
    return []


def slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (``toc``'s default slugify, code spans as their text)."""
    from markdown.extensions.toc import slugify

    return slugify(heading.replace("`", ""), "-")


@functools.lru_cache(maxsize=None)
def report_sections(path: str) -> Dict[str, dict]:
    """``claim id -> {heading, anchor, data, verdict, checks, arms, text}`` of one generated report."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = {}
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2]):
        m = re.match(r"## (.*) \(`(\w+)`\)$", heading)
        if not m:
            continue
        data = re.search(r"^Data: (.*?)\. Seeds:", body, re.M)
        # "**Verdict: not resolved**", "**Verdict: invalid (arm x did not train)**": the words before any reason
        verdict = re.search(r"^\*\*Verdict: ([a-z ]+?)(?: \(|[.*])", body, re.M)
        checks = {row[0]: row[-1] for row in _table_rows(body, "| check |")}
        arm_rows = _table_rows(body, "| arm |")
        header = next((ln for ln in body.splitlines() if ln.startswith("| arm |")), "")
        names = [c.strip() for c in header.strip().strip("|").split(" | ")]
        arms = {row[0]: dict(zip(names, row)) for row in arm_rows}
        out[m.group(2)] = {"heading": heading[3:], "anchor": slug(heading[3:]), "data": data and data.group(1),
                           "verdict": verdict and verdict.group(1), "checks": checks, "arms": arms,
                           "text": heading + body}
    return out


def _base_verdict(cell: str) -> str:
    for v in (*VERDICTS, INVALID):
        if cell.startswith(v):
            return v
    return cell


@functools.lru_cache(maxsize=None)
def summary_claims(path: str) -> Dict[str, dict]:
    """``claim id -> {verdict, report, anchor, ...}`` of a summary page: each row of its claims table
    joined to its report's section by family, claim and data (the rows carry no id)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = {}
    folder = os.path.dirname(path)
    for row in _table_rows(text, "| family | data | claim |"):
        family, data, claim, verdict, details = row[0], row[1], row[2], row[4], row[-1]
        link = re.search(r"\]\(([^)]+)\)", details)
        if link is None:
            # a claim declared not applicable before any run: no report section, no verdict
            assert row[3].startswith("not run") and verdict.startswith("not applicable"), \
                f"{path}: row {family} / {data[:40]} has no report link"
            continue
        link = link.group(1)
        report = os.path.normpath(os.path.join(folder, link))
        matches = [cid for cid, s in report_sections(report).items()
                   if s["heading"].startswith(f"{family}: {claim} (") and s["data"] == data]
        assert len(matches) == 1, f"{path}: row {family} / {data[:40]} matches sections {matches} of {report}"
        cid = matches[0]
        section = report_sections(report)[cid]
        # a qualified verdict ("reproduced at this budget") must carry the same qualifier in both places
        assert verdict.startswith(section["verdict"]) and _base_verdict(verdict) == _base_verdict(section["verdict"]), \
            f"{path}: {cid} summary and report disagree"
        out[cid] = {"verdict": _base_verdict(verdict), "report": report, "primary": row[3], **section}
    return out


@functools.lru_cache(maxsize=None)
def latest_claims() -> Dict[str, dict]:
    """Every claim's latest line: revision 3's summary, and for a claim it lists as not run under
    revision 3 yet, revision 3's rules on revision 2's runs."""
    claims = dict(summary_claims(LATEST))
    with open(LATEST, encoding="utf-8") as f:
        text = f.read()
    not_run = text.split("## Not run under revision 3 yet", 1)
    if len(not_run) == 2:
        older = summary_claims(ON_REV2)
        for cid in re.findall(r"^- `(\w+)`", not_run[1], re.M):
            claims.setdefault(cid, older[cid])
    return claims


def claims_of(rev: str) -> Dict[str, dict]:
    return latest_claims() if rev == "3" else summary_claims(SUMMARIES[rev])


# --- the checker --------------------------------------------------------------------------------

def _history_spans(text: str) -> List[Tuple[int, int]]:
    """Character spans of the history sections (a matching heading up to the next heading of the
    same or a higher level)."""
    spans, lines, pos = [], text.splitlines(keepends=True), 0
    starts = []
    for line in lines:
        starts.append(pos)
        pos += len(line)
    for i, line in enumerate(lines):
        if HISTORY_HEADING.match(line):
            level = len(line) - len(line.lstrip("#"))
            end = len(text)
            for j in range(i + 1, len(lines)):
                lv = len(lines[j]) - len(lines[j].lstrip("#"))
                if lines[j].startswith("#") and lv <= level and lines[j][lv:lv + 1] == " ":
                    end = starts[j]
                    break
            spans.append((starts[i], end))
    return spans


def _strip_code(text: str) -> str:
    """Fenced code blocks blanked (same length), so that their words are not read as verdicts."""
    return re.sub(r"```.*?```", lambda m: " " * len(m.group(0)), text, flags=re.S)


def check_page(rel: str, text: str) -> List[str]:
    """Every problem of one page (``rel`` relative to ``docs/``) under the citation convention."""
    problems = []
    text = _strip_code(text)
    cites = list(CITATION.finditer(text))
    covered = [(m.start(), m.end()) for m in cites]
    history = _history_spans(text)
    for m in _VERDICT_WORD.finditer(text):
        inside = any(a <= m.start() < b for a, b in covered)
        if not inside and not any(a <= m.start() < b for a, b in history):
            line = text[:m.start()].count("\n") + 1
            problems.append(f"{rel}:{line}: verdict word {m.group(0)!r} outside a claim citation")
    first_rev3: Dict[str, int] = {}
    for m in cites:
        line = text[:m.start()].count("\n") + 1
        rev, cid, verdict, check = m.group("rev"), m.group("claim"), m.group("verdict"), m.group("check")
        claims = claims_of(rev)
        if cid not in claims:
            problems.append(f"{rel}:{line}: `{cid}` has no revision-{rev} line")
            continue
        claim = claims[cid]
        path, _, anchor = m.group("link").partition("#")
        target = resolve(rel, path)
        if target != claim["report"]:
            problems.append(f"{rel}:{line}: `{cid}` links {os.path.relpath(target, ROOT)}, its revision-{rev} "
                            f"line is in {os.path.relpath(claim['report'], ROOT)}")
        if anchor != claim["anchor"]:
            problems.append(f"{rel}:{line}: `{cid}` links #{anchor}, its section is #{claim['anchor']}")
        if check is None:
            if verdict != claim["verdict"]:
                problems.append(f"{rel}:{line}: `{cid}` is {claim['verdict']!r} in revision {rev}, the page "
                                f"says {verdict!r}")
        else:
            held = claim["checks"].get(check)
            if held is None:
                problems.append(f"{rel}:{line}: `{cid}` has no check {check!r}")
            elif _base_verdict(held) != verdict:
                problems.append(f"{rel}:{line}: `{cid}`, {check}: {held!r} in revision {rev}, the page says "
                                f"{verdict!r}")
        if rev == "3":
            first_rev3.setdefault(cid, m.start())
        elif cid in latest_claims() and first_rev3.get(cid, len(text)) > m.start():
            problems.append(f"{rel}:{line}: `{cid}` cited from revision 2 before (or without) its revision-3 line")
    return problems


def resolve(rel: str, link: str) -> str:
    """The file a link on page ``rel`` (relative to ``docs/``) opens on the site, where the hook
    docs/_hooks/results_files.py publishes the repository's ``results/`` beside the pages."""
    target = os.path.normpath(os.path.join(os.path.dirname(rel), link)).replace(os.sep, "/")
    return os.path.join(ROOT, target) if target.startswith("results/") else os.path.join(DOCS, target)


def _read(rel: str) -> str:
    with open(os.path.join(DOCS, rel), encoding="utf-8") as f:
        return f.read()


#: the pages under the convention: every family page and the pages that recommend or summarise
CHECKED_PAGES = sorted(f"losses/{n}" for n in os.listdir(os.path.join(DOCS, "losses")) if n.endswith(".md")) \
    + ["choosing.md", "faq.md", "index.md"]


@pytest.mark.parametrize("rel", CHECKED_PAGES)
def test_page_names_only_the_latest_verdicts(rel):
    problems = check_page(rel, _read(rel))
    assert not problems, "\n".join(problems)


def test_every_latest_claim_is_cited_on_its_family_page():
    claims = latest_claims()
    assert set(CLAIM_PAGES) == set(claims), (
        f"claims without a family page here: {sorted(set(claims) - set(CLAIM_PAGES))}; "
        f"mapped but not in the latest results: {sorted(set(CLAIM_PAGES) - set(claims))}")
    missing = []
    for cid, page in CLAIM_PAGES.items():
        rev3 = [m for m in CITATION.finditer(_read(page)) if m.group("claim") == cid and m.group("rev") == "3"
                and m.group("check") is None]
        if not rev3:
            missing.append(f"{page}: no revision-3 citation of `{cid}`")
    assert not missing, "\n".join(missing)


def test_family_pages_lead_with_the_latest_revision():
    """In each family page's "Measured" section the revision-3 lines come before the history."""
    for rel in CHECKED_PAGES:
        if not rel.startswith("losses/"):
            continue
        text = _read(rel)
        cited = [m for m in CITATION.finditer(text) if m.group("rev") == "3"]
        if not cited:
            continue
        history = _history_spans(text)
        assert history, f"{rel}: cites revision 3 and has no history section"
        assert cited[0].start() < history[0][0], f"{rel}: the history comes before the revision-3 lines"


# --- docs/choosing.md ---------------------------------------------------------------------------

def _choosing_rows(text: str) -> List[List[str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---") and not line.startswith("| situation"):
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def _tail_ranking(cid: str) -> List[Tuple[float, str]]:
    arms = latest_claims()[cid]["arms"]
    ranked = []
    for label, cells in arms.items():
        loss = next(name for prefix, name in ARM_LOSSES if label.startswith(prefix))
        ranked.append((float(cells["acc_tail"].split(" ±")[0]), loss))
    return sorted(ranked, reverse=True)


def choosing_problems(text: str) -> List[str]:
    """Everything docs/choosing.md must hold beyond the citation convention."""
    import losses

    problems = []
    # every registry entry, by name
    missing = [s.name for s in losses.list_losses() if f"`{s.name}`" not in text]
    if missing:
        problems.append(f"choosing.md does not name {missing}")
    rows = _choosing_rows(text)
    # a measured number cites a results file and is in what it cites (the claim's section for a
    # claim citation, the file for any other link into results/)
    for row in rows:
        cell = " | ".join(row[2:])
        numbers = _NUMBER.findall(re.sub(r"\\\(.*?\\\)|`[^`]*`", "", cell))
        sources = []
        for m in CITATION.finditer(cell):
            claim = claims_of(m.group("rev")).get(m.group("claim"))
            if claim:
                sources.append(claim["text"])
        for link in re.findall(r"\]\(((?:\.\./)*results/[^)#\s]+)", cell):
            with open(resolve("choosing.md", link), encoding="utf-8") as f:
                sources.append(f.read())
        if numbers and not sources:
            problems.append(f"{row[0]}: quotes {numbers} and cites no results")
            continue
        found = [float(x.replace("−", "-")) for src in sources for x in _NUMBER.findall(src)]
        for q in numbers:
            value, digits = float(q.replace("−", "-")), len(q.split(".")[1])
            if not any(round(x, digits) == value or round(abs(x), digits) == abs(value) for x in found):
                problems.append(f"{row[0]}: {q} is not in the cited results")
    # the long-tail row names first the losses with the best tail accuracy in the long-tail claims
    best = {_tail_ranking(cid)[0][1] for cid in LONG_TAIL_CLAIMS}
    tail_rows = [r for r in rows if "long-tail" in r[0].lower() or "long tail" in r[0].lower()]
    if not tail_rows:
        problems.append("choosing.md: no long-tail row")
    names = set(losses.loss_names())
    for row in tail_rows:
        lead = [n for n in re.findall(r"`(\w+)`", row[1]) if n in names][:len(best)]
        if set(lead) != best:
            problems.append(f"long-tail row {row[0]!r} leads with {lead}, the results rank {sorted(best)} first")
    # a language-model row that links the language-model page
    if not any("language model" in r[0].lower() and "language_model.md" in " ".join(r) for r in rows):
        problems.append("choosing.md: no language-model row linking language_model.md")
    return problems


def test_choosing_follows_the_registry_and_the_results():
    problems = choosing_problems(_read("choosing.md"))
    assert not problems, "\n".join(problems)


def test_choosing_checks_can_fail():
    text = _read("choosing.md")
    row = next(ln for ln in text.splitlines() if ln.startswith("| long-tailed classes"))
    # GOL first in the long-tail row
    swapped = row.replace("(`logit_adjusted`)", "(`gol`)", 1)
    assert any("leads with" in p for p in choosing_problems(text.replace(row, swapped)))
    # a quoted number the cited section does not hold
    assert any("0.994 is not in" in p for p in choosing_problems(text.replace(row, row.replace("0.894", "0.994"))))
    # a registry entry dropped, the language-model row dropped
    assert any("`focal`" not in p and "focal" in p for p in choosing_problems(text.replace("(`focal`)", "")))
    lm = next(ln for ln in text.splitlines() if ln.startswith("| language model"))
    assert any("language-model row" in p for p in choosing_problems(text.replace(lm + "\n", "")))


# --- docs/conventions.md ------------------------------------------------------------------------

def unit_table_problems(text: str) -> List[str]:
    import losses

    rows = _table_rows(text, "| unit | losses |")
    if not rows:
        return ["conventions.md: no unit table"]
    where: Dict[str, List[str]] = {}
    for unit_cell, losses_cell in rows:
        unit = re.match(r"\w+", unit_cell).group(0)
        for name in re.findall(r"`(\w+)`", losses_cell):
            where.setdefault(name, []).append(unit)
    problems = [f"{spec.name}: registry unit {spec.unit!r}, table rows {where.get(spec.name)}"
                for spec in losses.list_losses() if where.get(spec.name) != [spec.unit]]
    problems += [f"{name}: not registered" for name in sorted(set(where) - set(losses.loss_names()))]
    return problems


def test_conventions_unit_table_matches_the_registry():
    problems = unit_table_problems(_read("conventions.md"))
    assert not problems, "\n".join(problems)


def test_unit_table_check_can_fail():
    text = _read("conventions.md")
    moved = text.replace("`focal`, ", "").replace("`bce_with_logits`, ", "`bce_with_logits`, `focal`, ")
    assert any(p.startswith("focal: registry unit 'position'") for p in unit_table_problems(moved))
    assert any(p.startswith("bpr:") for p in unit_table_problems(text.replace("| `bpr` |", "| |")))


# --- the checker can fail -------------------------------------------------------------------------

def _a_citation(cid: str, verdict: Optional[str] = None, rev: str = "3", anchor: Optional[str] = None) -> str:
    claim = claims_of(rev)[cid]
    link = "../" + os.path.relpath(claim["report"], ROOT)
    return (f"**{verdict or claim['verdict']}** ([revision {rev}, `{cid}`]"
            f"({link}#{anchor or claim['anchor']}))")


def test_checker_accepts_a_correct_citation():
    assert check_page("losses/x.md", "## Measured\n\n- " + _a_citation("gol") + "\n") == []


@pytest.mark.parametrize("cid", ["gol", "wcdas", "psl_popularity_shift"])
def test_checker_rejects_a_wrong_verdict(cid):
    held = latest_claims()[cid]["verdict"]
    wrong = next(v for v in VERDICTS if v != held)
    problems = check_page("losses/x.md", "- " + _a_citation(cid, wrong) + "\n")
    assert any(f"is {held!r}" in p for p in problems), problems


def test_checker_rejects_a_wrong_check_verdict():
    claim = latest_claims()["wcdas"]
    link = "../" + os.path.relpath(claim["report"], ROOT)
    check = "balanced_acc: WCDAS (LT) > logit-adjusted CE (LT)"
    assert claim["checks"][check] == "contradicted"
    text = f"**reproduced** ([revision 3, `wcdas`: {check}]({link}#{claim['anchor']}))"
    assert check_page("losses/x.md", text), "a check cited with the wrong verdict passed"


def test_checker_rejects_an_uncited_verdict_and_a_wrong_anchor():
    assert check_page("choosing.md", "| long tail | `gol` | reproduced |\n")
    assert check_page("losses/x.md", _a_citation("gol", anchor="wcdas"))


def test_checker_rejects_a_revision2_citation_without_the_latest():
    rev2 = _a_citation("gol_2stage", rev="2")
    assert check_page("losses/x.md", rev2), "a revision-2 verdict with no revision-3 line passed"
    both = _a_citation("gol_2stage") + "\n\n### Revision 2 (history)\n\n" + rev2
    assert check_page("losses/x.md", both) == []


def test_checker_reads_the_summary():
    """The parser finds every claim the summary counts, each joined to its report's section."""
    with open(LATEST, encoding="utf-8") as f:
        head = f.read()
    counted = int(re.search(r"\*\*(\d+) of \d+ claims\*\*", head).group(1))
    assert len(summary_claims(LATEST)) == counted
    assert latest_claims()["gol"]["verdict"] == "not resolved"
    assert latest_claims()["psl_popularity_shift"]["verdict"] == "contradicted"


# --- docs/results.md ------------------------------------------------------------------------------

def _mean_ci(text: str) -> Optional[str]:
    m = re.search(r"([+\-−]\d+\.\d+ \[[+\-−]\d+\.\d+, [+\-−]\d+\.\d+\])", text)
    return m.group(1).replace("−", "-") if m else None


def results_table_problems(text: str) -> List[str]:
    """The revision-3 claims table of docs/results.md against the latest results: each row's verdict
    is that of the claim whose primary check has the row's mean difference and CI, and every claim
    of revision 3's summary has a row."""
    by_primary = {}
    for cid, claim in summary_claims(LATEST).items():
        by_primary.setdefault(_mean_ci(claim["primary"]), []).append(cid)
    problems, seen = [], set()
    for row in _table_rows(text, "| claim | primary check | family − baseline [95% CI] | verdict |"):
        verdict = row[-1]
        if verdict.startswith("holds"):
            continue
        cids = by_primary.get(_mean_ci(row[2]), [])
        if not cids:
            problems.append(f"results.md: {row[0]!r}: {row[2]!r} is no revision-3 primary check")
            continue
        seen.update(cids)
        held = {latest_claims()[c]["verdict"] for c in cids}
        if _base_verdict(verdict) not in held:
            problems.append(f"results.md: {row[0]!r} says {verdict.split(' (')[0]!r}, the summary {sorted(held)}")
    missing = set(summary_claims(LATEST)) - seen
    if missing:
        problems.append(f"results.md: no row for {sorted(missing)}")
    return problems


def test_results_page_table_agrees_with_the_summary():
    problems = results_table_problems(_read("results.md"))
    assert not problems, "\n".join(problems)


def test_results_table_check_can_fail():
    text = _read("results.md")
    row = next(ln for ln in text.splitlines() if ln.startswith("| GOL better on the tail (MNIST-LT, imbalance factor 50, one stage)"))
    assert "| not resolved (" in row
    wrong = text.replace(row, row.replace("| not resolved (", "| reproduced ("))
    assert any("GOL better on the tail" in p for p in results_table_problems(wrong))
    dropped = text.replace(row + "\n", "")
    assert any("no row for ['gol']" in p for p in results_table_problems(dropped))


#: a revision-4 claim declared not applicable, cited on its family page
NOT_APPLICABLE = re.compile(r"\*\*not applicable here\*\* \(\[revision 4, `(?P<claim>\w+)`\]\((?P<link>[^)\s]+)\)\)")


def revision4_claims() -> Tuple[set, set]:
    """(claims with a revision-4 verdict, claims declared not applicable here) in
    ``results/revision4/summary.md``: the claims of the command that wrote it (``--claims a,b,...``), a
    declaration a ``- `<claim id>`: not applicable here (...)`` line, every other claim decided."""
    with open(SUMMARIES["4"], encoding="utf-8") as f:
        text = f.read()
    listed = set(re.search(r"--claims ([\w,]+)", text).group(1).split(","))
    declared = set(re.findall(r"^- `(\w+)`: not applicable here", text, re.M))
    assert declared <= listed, declared - listed
    return listed - declared, declared


def test_every_revision_4_claim_is_cited_on_a_family_page():
    """Each claim of the revision-4 summary is cited on a family page: a decided one with its verdict,
    one declared not applicable with ``**not applicable here** ([revision 4, `<id>`](...summary.md))``."""
    decided, declared = revision4_claims()
    assert len(decided) >= 10 and len(declared) >= 5, (decided, declared)
    pages = {rel: _read(rel) for rel in CHECKED_PAGES if rel.startswith("losses/")}
    cited = {m.group("claim") for text in pages.values() for m in CITATION.finditer(text) if m.group("rev") == "4"}
    na = {m.group("claim"): m.group("link") for text in pages.values() for m in NOT_APPLICABLE.finditer(text)}
    assert not decided - cited, f"revision-4 claims no family page cites: {sorted(decided - cited)}"
    assert not declared - set(na), f"claims declared not applicable that no family page cites: {sorted(declared - set(na))}"
    assert not set(na) - declared, f"cited as not applicable but not declared so: {sorted(set(na) - declared)}"
    assert all(link.endswith("results/revision4/summary.md") for link in na.values()), na
