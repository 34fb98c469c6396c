"""The cross-batch summary of the revision-3 results (``benchmarks/revision3_summary.py``): the committed
page is what the script writes from the committed batch summaries, and the script's parsing is right
on a hand-made results folder (a claim row, a sanity-only claim, a stale row, the confidence means)."""
from __future__ import annotations

import csv
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "revision3_summary.py")


def _module():
    spec = importlib.util.spec_from_file_location("revision3_summary", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


rs = _module()
CF = rs.load_claims()


def test_the_committed_page_is_up_to_date():
    assert rs.main(["--check"]) == 0, "run python benchmarks/revision3_summary.py and commit the page"


def test_every_claim_appears_once_as_a_row_a_sanity_claim_or_not_run_yet():
    text = rs.build()
    assert "## Stale lines" not in text
    for c in CF.claims:
        in_rows = text.count(f"| {c.family} | {c.data} | {c.claim} |")
        listed = text.count(f"- `{c.key}` (")
        sanity = f"| `{c.key}` |" in text
        assert in_rows + listed == 1 or (sanity and in_rows + listed == 0), c.key


def _claim(key):
    return next(c for c in CF.claims if c.key == key)


def test_a_hand_made_folder(tmp_path):
    sp, z = _claim("sparsemax"), _claim("decoupled_softmax_stdlib")
    batch = tmp_path / "batch"
    batch.mkdir()
    head = "| family | data | claim | primary check: mean difference [CI], decidable at this n | verdict | secondary checks (Holm) | details |"
    (batch / "summary.md").write_text("\n".join([
        "# Reproduced claims: summary", "", head, "|---|---|---|---|---|---|---|",
        f"| {sp.family} | {sp.data} | {sp.claim} | top1: x: +0.0010 [-0.0020, +0.0040]; decidable: yes | reproduced | - | [vision.md](vision.md) |",
        f"| {sp.family} | {sp.data} | an edited claim text | top1: x | not resolved | - | [vision.md](vision.md) |",
        "", "Sanity checks:", "", "| claim | check | mean [CI] | result |", "|---|---|---|---|",
        f"| `{z.key}` | sanity: r@1 | +0.0000 [+0.0000, +0.0000] | holds |", ""]))
    cols = ["arm", "phase", "ok", "seed", "test/top1", "test/ece"]
    with open(batch / "vision_runs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerow({"arm": "sparsemax", "phase": "eval", "ok": "True", "seed": 0, "test/top1": "0.9", "test/ece": "0.1"})
        w.writerow({"arm": "sparsemax", "phase": "eval", "ok": "True", "seed": 1, "test/top1": "0.7", "test/ece": "0.3"})
        w.writerow({"arm": "sparsemax", "phase": "tune", "ok": "True", "seed": 1000, "test/top1": "", "test/ece": ""})
        w.writerow({"arm": "ce", "phase": "tune", "ok": "True", "seed": 1000, "test/top1": "", "test/ece": ""})
    text = rs.build(str(tmp_path))
    assert f"**1 of {len(CF.claims)} claims** have revision-3 runs: 1 reproduced, 0 contradicted" in text
    assert "1 sanity claim(s) (`decoupled_softmax_stdlib`)" in text
    assert "[batch/vision.md](batch/vision.md)" in text  # links made relative to the results folder
    assert "## Stale lines" in text and "an edited claim text" in text
    # the confidence means over the two evaluation runs (the tuning run is not counted; ce has none)
    conf = text.split("## Confidence", 1)[1]
    row = next(line for line in conf.splitlines() if line.startswith(f"| {CF.arms['sparsemax'].label} |"))
    assert row.startswith(f"| {CF.arms['sparsemax'].label} | `sparsemax` | 2 | 0.800 | 0.200 | - |"), row
    assert not any(line.startswith(f"| {CF.arms['ce'].label} |") for line in conf.splitlines())
    assert f"- `{z.key}` (" not in text and f"- `{sp.key}` (" not in text
    assert f"- `{_claim('entmax15').key}` (" in text
    assert rs.main(["--root", str(tmp_path)]) == 0
    assert rs.main(["--root", str(tmp_path), "--check"]) == 0
    (tmp_path / "summary.md").write_text("old\n")
    assert rs.main(["--root", str(tmp_path), "--check"]) == 1


def test_a_claim_run_again_in_a_later_batch_takes_its_line_sanity_rows_and_runs(tmp_path):
    """Two batches with the same claim: the later folder (name order) supplies the claim's line, its
    sanity rows (no duplicate) and the confidence means; the page names the superseded batch."""
    sp = _claim("sparsemax")
    head = "| family | data | claim | primary check: mean difference [CI], decidable at this n | verdict | secondary checks (Holm) | details |"
    cols = ["arm", "phase", "ok", "seed", "test/top1", "test/ece"]
    for name, verdict, top1 in (("a_first", "not resolved", "0.5"), ("b_again", "reproduced", "0.9")):
        batch = tmp_path / name
        batch.mkdir()
        (batch / "summary.md").write_text("\n".join([
            "# Reproduced claims: summary", "", head, "|---|---|---|---|---|---|---|",
            f"| {sp.family} | {sp.data} | {sp.claim} | top1: {name} | {verdict} | - | [vision.md](vision.md) |",
            "", "Sanity checks:", "", "| claim | check | mean [CI] | result |", "|---|---|---|---|",
            f"| `{sp.key}` | sanity: support < 10 | {name} | holds |", ""]))
        with open(batch / "vision_runs.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            w.writerow({"arm": "sparsemax", "phase": "eval", "ok": "True", "seed": 0, "test/top1": top1, "test/ece": "0.1"})
    text = rs.build(str(tmp_path))
    assert "top1: b_again" in text and "top1: a_first" not in text
    assert "1 reproduced, 0 contradicted, 0 not resolved" in text
    assert text.count("sanity: support < 10") == 1 and "| b_again | holds |" in text
    conf = text.split("## Confidence", 1)[1]
    row = next(line for line in conf.splitlines() if line.startswith(f"| {CF.arms['sparsemax'].label} |"))
    assert "| 1 | 0.900 |" in row, row
    assert "`sparsemax` (a_first -> b_again)" in text
