"""MkDocs hook: the docstrings' reStructuredText roles shown as plain code.

The docstrings name other objects the way Sphinx reads them (``:func:`fit```,
``:class:`~rlhf_jax.loop.Loop```); mkdocstrings renders them as Markdown, where the role
stayed on the page as text (":func:" before the name). Here the role is dropped and a
leading ``~`` (Sphinx's "show the last part only") applied, so the page shows the name.
"""
from __future__ import annotations

import re

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|data|attr|obj|exc|const):<code>(~?)([^<]*)</code>")


def plain_code(match: re.Match) -> str:
    short, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if short else name}</code>"


def on_page_content(html: str, **_) -> str:
    return ROLE.sub(plain_code, html)
