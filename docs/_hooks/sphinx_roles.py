"""An mkdocs hook: the package's docstrings cross-reference in Sphinx's style (:class:`~optuna_saturn.X`), which
Python's own help and IDEs show as written; mkdocstrings renders them as a role name before a code span. Here
each becomes the code span alone, with a leading ``~`` meaning "show the last part only", as Sphinx does. A
paragraph that ends in reST's literal marker ("exact::", before an indented example) ends in one colon, and a
marker alone goes, as Sphinx renders them (Markdown already shows the indented block as code)."""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc|obj|const):<code>(~?)([^<]+)</code>")


def _span(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


_LITERAL_ALONE = re.compile(r"<p>\s*::\s*</p>")
_LITERAL_AFTER_TEXT = re.compile(r"(?<=\S)::(?=\s*</p>)")


def on_page_content(html: str, **_: Any) -> str:
    html = _LITERAL_AFTER_TEXT.sub(":", _LITERAL_ALONE.sub("", html))
    return _ROLE.sub(_span, html)
