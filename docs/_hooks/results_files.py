"""MkDocs hook: publish the committed ``results/`` directory (generated reports, plots, CSVs) as
part of the site under ``results/``, so the pages link and embed the measured numbers and plots
without copying them into ``docs/``. The files are written only by the benchmark scripts
(``benchmarks/reproduce_results.py``, ``benchmarks/perf_losses.py``).
"""

from __future__ import annotations

import os

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTENSIONS = (".md", ".png", ".csv")


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
