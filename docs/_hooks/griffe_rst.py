"""Griffe extension: render the reST-flavoured bits of this project's docstrings as Markdown.

The docstrings are Google style (``Args:``) but use a few reST idioms that Markdown would mangle:

* doctest lines (``>>> ...`` / ``... ...`` and their output) become a fenced ``pycon`` block
  (Markdown would read ``>>>`` as nested block quotes);
* roles such as ``:func:`name``` / ``:class:`~pkg.Name``` become inline code;
* maths: the role ``:math:`x^2``` becomes ``\\(x^2\\)`` and a ``.. math::`` directive (its indented
  body, one display per paragraph) becomes ``\\[ ... \\]``, the delimiters ``pymdownx.arithmatex``
  hands to MathJax on the hand-written pages (``$...$`` and ``$$...$$`` already work as they are);
* a paragraph ending in ``::`` (a reST literal block follows) ends in ``:`` instead.

Only the rendered text changes; the docstrings in the source stay as they are. mkdocstrings parses
the Google sections (``Args:``, ``Returns:``, ``Raises:``) of the API pages itself; a page that
puts a docstring into plain Markdown (the generated family pages of docs/_hooks/api_pages.py) turns
them into lists with :func:`google_sections` first.
"""

from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|obj|exc|py:\w+):`~?([^`]+)`")
_PROMPT = re.compile(r"^(\s*)(>>>|\.\.\.)( |$)")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_MATH_DIRECTIVE = re.compile(r"^(\s*)\.\. math::[ \t]*(.*)$")
_DIRECTIVE_OPTION = re.compile(r"^\s*:[\w-]+:")  # :label:, :nowrap: (MathJax needs neither)


def _math_directives(text: str) -> str:
    """``.. math::`` and its indented body -> one ``\\[ ... \\]`` block per paragraph of the body."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = _MATH_DIRECTIVE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, body = m.group(1), [m.group(2)] if m.group(2).strip() else []
        i += 1
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():  # the blank lines after the body stay outside it
            body.pop()
            i -= 1
        body = [b for b in body if not _DIRECTIVE_OPTION.match(b)]
        displays, current = [], []
        for b in body + [""]:
            if b.strip():
                current.append(b.strip())
            elif current:
                displays.append(current)
                current = []
        for d in displays:
            out += ["", f"{indent}\\[", *[indent + b for b in d], f"{indent}\\]", ""]
    return "\n".join(out)


def _fence_doctests(text: str) -> str:
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = _PROMPT.match(lines[i])
        if not (m and m.group(2) == ">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = m.group(1)
        block = []
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            block.append(lines[i][len(indent):])
            i += 1
        out += [f"{indent}```pycon", *[indent + b for b in block], f"{indent}```"]
    return "\n".join(out)


#: Google-style section headers and the title each gets as Markdown
SECTIONS = {
    "Args": "Parameters", "Arguments": "Parameters", "Parameters": "Parameters", "Params": "Parameters",
    "Keyword Args": "Keyword parameters", "Keyword Arguments": "Keyword parameters",
    "Other Parameters": "Other parameters", "Attributes": "Attributes",
    "Returns": "Returns", "Return": "Returns", "Yields": "Yields", "Raises": "Raises", "Warns": "Warns",
}
_SECTION = re.compile(r"^(\s*)(" + "|".join(sorted(SECTIONS, key=len, reverse=True)) + r"):\s*$")
#: ``name: text`` or ``name (type): text`` at the start of an item
_ITEM = re.compile(r"^(\*{0,2}[A-Za-z_][\w.]*)(?:\s*\(([^)]*)\))?:\s+(.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def google_sections(text: str) -> str:
    """Google-style sections (``Args:``, ``Returns:``, ``Raises:``, ...) as Markdown: a bold title
    and one list item per entry (``name`` in code, its continuation lines joined), the way the
    API pages show them. Text outside the sections is unchanged."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = _SECTION.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        base, title = len(m.group(1)), SECTIONS[m.group(2)]
        i += 1
        body = []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
            i -= 1
        if not body:
            out.append(lines[i - 1] if i else "")
            continue
        item_indent = min(_indent(b) for b in body if b.strip())
        items = []
        for b in body:
            if not b.strip():
                continue
            if _indent(b) == item_indent:
                items.append(b.strip())
            else:
                items[-1] += " " + b.strip()
        rendered = []
        for item in items:
            im = _ITEM.match(item)
            if im and title != "Returns":
                kind = f" ({im.group(2)})" if im.group(2) else ""
                rendered.append(f"{m.group(1)}- `{im.group(1)}`{kind}: {im.group(3)}")
            else:
                rendered.append(f"{m.group(1)}- {item}")
        if title == "Returns" and len(rendered) == 1:
            rendered = [m.group(1) + rendered[0].strip()[2:]]
        out += ["", f"{m.group(1)}**{title}:**", "", *rendered, ""]
    return "\n".join(out)


def rewrite(text: str) -> str:
    text = _math_directives(text)
    text = _MATH_ROLE.sub(lambda m: f"\\({m.group(1)}\\)", text)
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    text = re.sub(r"(?<=\S)::\n", ":\n", text)
    return _fence_doctests(text)


class ReSTToMarkdown(griffe.Extension):
    """Rewrite each docstring once, when griffe has loaded the object."""

    def on_object(self, *, obj, **kwargs) -> None:  # griffe >= 1.x
        if obj.docstring is not None and not getattr(obj.docstring, "_rst_rewritten", False):
            obj.docstring.value = rewrite(obj.docstring.value)
            obj.docstring._rst_rewritten = True
