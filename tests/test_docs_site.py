"""The documentation site builds in strict mode and renders in a real headless browser.

1. ``mkdocs build --strict`` into a temporary directory: a broken link, a missing page or anchor, an
   unresolved cross-reference or a docstring that fails to render is an error.
2. The built site is served on localhost and opened with Debian's ``chromium`` through
   ``chromedriver`` (selenium): on the home page and one family page the formulas are typeset by
   MathJax (``mjx-container`` elements exist), every navigation link answers HTTP 200, the page
   logs no console error and loads nothing from outside localhost (the site works offline).
3. The navigation holds the guide pages and no report: every report under ``results/`` is built and
   linked from the "Results and reports" page (``results.html``), and no navigation title shows a
   raw backtick.
4. The rendering details: no page shows TeX source (``\\texttt`` outside the maths, or a backslash
   in typeset maths, as ``\\texttt{a\\_b}`` gives), formulas written in a docstring are typeset on
   the API page, long signatures are formatted over several lines (ruff, from the docs extra),
   and the names in the registry table never wrap; a generated family page shows the Google
   sections of a docstring (``Args:``, ``Returns:``, ``Raises:``) as lists, never as raw text.

``./scripts/install.sh --docs-test`` installs ``chromium`` and ``chromium-driver`` with apt (a plain
``./scripts/install.sh`` never uses apt); without them the first test below fails and says so.
"""

from __future__ import annotations

import functools
import http.server
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
PAGES = ("index.html", "losses/z_loss.html")
#: TeX errors and undefined macros (MathJax shows those in red instead of failing)
TEX_ERRORS = "return document.querySelectorAll('mjx-merror, [data-mjx-error], mjx-container [style*=red]').length"
#: the TeX source of every typeset formula whose output shows a backslash (``\\_`` in ``\\texttt``)
TEX_SHOWN = ("return Array.from(MathJax.startup.document.math)"
             ".filter(m => MathJax.startup.toMML(m.root).replace(/<[^>]*>/g, '').includes('\\\\'))"
             ".map(m => m.math)")
#: the API page whose docstrings hold formulas (``:math:`` and ``.. math::``, see docs/_hooks/griffe_rst.py)
API_PAGE = "api/losses.html"
API_MATHS = ("losses.classification.zloss.z_loss", "losses.classification.sparsemax.sparsemax_loss")
#: a formula inside an arithmatex element of the built HTML
_ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">.*?</\1>', re.S)
_SIGNATURE = re.compile(r'<div class="doc-signature[^"]*"[^>]*>(.*?)</div>', re.S)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed ({time.time() - t0:.0f} s):\n{log[-6000:]}"
    return str(out)


def _check_build(site_dir):
    for page in ("index.html", "conventions.html", "api/losses.html", "api/registry.html",
                 "assets/mathjax/tex-chtml.js"):
        assert os.path.isfile(os.path.join(site_dir, page)), page
    import losses

    api = open(os.path.join(site_dir, "api", "losses.html"), encoding="utf-8").read()
    for spec in losses.list_losses():
        for obj in (spec.function, spec.module):
            assert f'id="{obj.__module__}.{obj.__name__}"' in api, f"{obj.__name__} missing from the API reference"

    for dirpath, _, names in os.walk(site_dir):
        for path in (os.path.join(dirpath, n) for n in names if n.endswith(".html")):
            with open(path, encoding="utf-8") as f:
                text = _ARITHMATEX.sub("", f.read())
            assert "\\texttt" not in text, f"{os.path.relpath(path, site_dir)}: TeX shown as text outside the maths"

    # the reports: built, out of the navigation, every one linked from results.html
    index = open(os.path.join(site_dir, "index.html"), encoding="utf-8").read()
    nav = re.search(r'<nav class="md-nav md-nav--primary".*?</nav>', index, re.S).group(0)
    assert 'href="results/' not in nav, "a report is in the navigation (mkdocs.yml not_in_nav: /results/)"
    titles = [html.unescape(re.sub(r"<[^>]+>", "", t)).strip()
              for t in re.findall(r'<span class="md-ellipsis">(.*?)</span>', nav, re.S)]
    assert titles and not [t for t in titles if "`" in t], f"navigation titles with raw backticks: {titles}"
    results_page = open(os.path.join(site_dir, "results.html"), encoding="utf-8").read()
    for dirpath, _, names in os.walk(os.path.join(ROOT, "results")):
        for name in (n for n in names if n.endswith(".md")):
            built = "index.html" if name == "README.md" else name[:-3] + ".html"  # MkDocs' README rule
            rel = os.path.relpath(os.path.join(dirpath, built), ROOT).replace(os.sep, "/")
            assert os.path.isfile(os.path.join(site_dir, rel)), f"{rel} not built"
            assert f'href="{rel}"' in results_page, f"{rel} is not linked from results.html"

    # generated family pages: Google sections as lists (the hook's conversion), never raw
    for spec in losses.list_losses():
        mod = spec.module.__module__
        page = os.path.join(site_dir, "losses", mod.rsplit(".", 1)[-1] + ".html")
        if not os.path.isfile(page):
            continue
        text = open(page, encoding="utf-8").read()
        for raw in ("Args:", "Returns:", "Raises:", "Arguments:"):
            assert not re.search(rf"(<p>|\n)\s*{raw}", text), f"{page}: a raw {raw!r} section"
    focal = open(os.path.join(site_dir, "losses", "focal.html"), encoding="utf-8").read()
    assert re.search(r"<strong>Parameters:</strong>.*?<ul>\s*<li><code>input</code>", focal, re.S), \
        "losses/focal.html: the parameters are not a list"

    # a long signature is formatted one parameter a line (the formatter is in the docs extra)
    start = api.index('id="losses.classification.zloss.z_loss"')
    signature = html.unescape(re.sub(r"<[^>]+>", "", _SIGNATURE.search(api, start).group(1))).strip()
    lines = signature.splitlines()
    assert len(lines) >= 5 and lines[0] == "z_loss(" and lines[-1] == ") -> Tensor", \
        f"z_loss: the signature is not formatted over several lines:\n{signature}"


@pytest.fixture(scope="module")
def server(site_dir):
    handler = functools.partial(_QuietHandler, directory=site_dir)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


def _missing_browser() -> str:
    missing = [pkg for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver"))
               if not os.path.exists(path)]
    if not missing:
        return ""
    return (f"{' and '.join(missing)} not found (looked for {CHROMIUM} and {CHROMEDRIVER}): the docs test needs "
            "chromium and chromedriver; install them with ./scripts/install.sh --docs-test (apt-get install "
            "chromium chromium-driver, as root or with sudo)")


def test_chromium_and_chromedriver_are_installed():
    """A machine without the browser fails here, with the command that installs it (never a skip)."""
    assert not _missing_browser(), _missing_browser()


@pytest.fixture(scope="module")
def browser():
    assert not _missing_browser(), _missing_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="docs-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _hook(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_docs_hook_{name}", os.path.join(ROOT, "docs", "_hooks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_google_sections_become_lists():
    """The conversion the generated pages use: each entry an item, continuation lines joined, the
    text around unchanged; a wrongly parsed section fails this."""
    google = _hook("griffe_rst").google_sections
    doc = ("Intro.\n\nArgs:\n    x: the input,\n        on two lines.\n    y (int): a count.\n\n"
           "Returns:\n    The loss.\n\nRaises:\n    ValueError: on a bad shape.\n\nTail.")
    out = google(doc)
    assert "**Parameters:**\n\n- `x`: the input, on two lines.\n- `y` (int): a count." in out, out
    assert "**Returns:**\n\nThe loss." in out and "- `ValueError`: on a bad shape." in out, out
    assert out.startswith("Intro.") and out.rstrip().endswith("Tail.") and "Args:" not in out, out
    assert google("No sections here.\n  Args: inline is text") == "No sections here.\n  Args: inline is text"


def test_navigation_titles_are_plain_text():
    api = _hook("api_pages")
    assert api._first_line("The ``foo`` and :func:`bar` loss (docs/conventions.md).") == "The foo and bar loss"
    assert api._first_line("``Focal`` loss: softmax cross-entropy, down-weighted.") == "Focal loss"
    assert api._heading("The ``foo`` loss.") == "The `foo` loss"


def test_generated_pages_report_their_benchmark_arms():
    """A generated family page whose loss ran as a benchmark arm has a "Measured" section with the
    arm's line of the latest summary, each claim linked to the family page that reports it."""
    api = _hook("api_pages")
    pages = api.generated_family_pages()
    md = pages["losses.classification.logit_adjusted"][2]
    assert "## Measured" in md and "| logit-adjusted CE (LT) | [`gol`](gol.md#measured)" in md, md[-1500:]
    assert api.measured_section(["no_such_loss"]) == ""


def test_docs_site_builds_strict_and_renders_in_chromium(site_dir, browser, server):
    """One test (not one per page) so that pytest-xdist builds the site once."""
    _check_build(site_dir)
    for page in PAGES:
        _check_page(browser, server, page)
    _check_api_maths(browser, server)
    _check_every_formula(browser, server, site_dir)
    _check_registry_table(browser, server)


def _typeset(browser, server, rel):
    """Open ``rel`` and wait until MathJax has typeset every formula, without errors or TeX shown."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + rel)
    WebDriverWait(browser, 30).until(
        lambda d: d.execute_script("return document.querySelectorAll('mjx-container').length >= "
                                   "document.querySelectorAll('.arithmatex').length"),
        message=f"{rel}: MathJax did not typeset every formula",
    )
    assert browser.execute_script(TEX_ERRORS) == 0, f"{rel}: a formula failed to typeset"
    shown = browser.execute_script(TEX_SHOWN)
    assert not shown, f"{rel}: typeset formulas show a backslash: {shown}"


def _check_api_maths(browser, server):
    """Formulas written in the docstrings are typeset on the API page (in the object's own section)."""
    _typeset(browser, server, API_PAGE)
    for ident in API_MATHS:
        found = browser.execute_script(
            "const h = document.getElementById(arguments[0]);"
            "return h ? h.closest('.doc-object').querySelectorAll('.doc-contents mjx-container').length : -1", ident)
        assert found > 0, f"{API_PAGE}: no typeset formula in the docstring of {ident} (got {found})"


def _check_registry_table(browser, server):
    """Registry, function and class names stay on one line in the registry table."""
    browser.get(server + "api/registry.html")
    cells = browser.execute_script(
        "return Array.from(document.querySelectorAll('.registry-table td code'))"
        ".map(c => [c.textContent, getComputedStyle(c).whiteSpace, c.getClientRects().length])")
    import losses

    assert len(cells) >= 3 * len(losses.list_losses()), f"registry table: only {len(cells)} names"
    wrapped = [(name, ws, lines) for name, ws, lines in cells if ws != "nowrap" or lines != 1]
    assert not wrapped, f"registry table: names that wrap (name, white-space, lines): {wrapped}"


def _check_every_formula(browser, server, site_dir):
    """Every other page with formulas typesets all of them without TeX errors or TeX shown."""
    for dirpath, _, names in os.walk(site_dir):
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, site_dir).replace(os.sep, "/")
            if not name.endswith(".html") or rel in PAGES or rel == API_PAGE:
                continue
            with open(path, encoding="utf-8") as f:
                if 'class="arithmatex"' not in f.read():
                    continue
            _typeset(browser, server, rel)


def _check_page(browser, server, page):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + page)
    WebDriverWait(browser, 30).until(
        lambda d: d.execute_script("return document.querySelectorAll('mjx-container').length > 0"),
        message=f"{page}: MathJax typeset nothing",
    )
    # MathJax reports TeX errors inside the output rather than on the console
    errors = browser.execute_script(TEX_ERRORS)
    assert errors == 0, f"{page}: {errors} formula(s) failed to typeset"
    shown = browser.execute_script(TEX_SHOWN)
    assert not shown, f"{page}: typeset formulas show a backslash: {shown}"
    assert browser.execute_script("return document.querySelectorAll('.arithmatex').length") > 0

    hrefs = browser.execute_script(
        "return Array.from(document.querySelectorAll('nav.md-nav a.md-nav__link[href]')).map(a => a.href)")
    assert len(hrefs) >= 20, f"{page}: only {len(hrefs)} navigation links"
    bad = {}
    for href in sorted({h.split("#")[0] for h in hrefs}):
        assert href.startswith(server), f"{page}: navigation leaves the site: {href}"
        code = _status(href)
        if code != 200:
            bad[href] = code
    assert not bad, f"{page}: navigation links that do not answer 200: {bad}"

    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    outside = [u for u in resources if not u.startswith(server) and not u.startswith("data:")]
    assert not outside, f"{page}: loaded from outside localhost: {outside}"

    logs = browser.get_log("browser")
    severe = [entry for entry in logs if entry.get("level") == "SEVERE"]
    assert not severe, f"{page}: console errors: {severe}"
