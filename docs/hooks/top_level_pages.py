"""MkDocs hook: CONTRACT.md and ARCHITECTURE.md, which stay at the repository's top level, as pages.

Code, tests and other repositories link to the two files where they are, so they are not moved
into docs/. At build time this hook adds them to the site as `CONTRACT.md` and `ARCHITECTURE.md`
(read from the checkout, never copied into docs/), and rewrites the links that cross the
boundary so the strict build checks them like any other:
- a docs page links to them as GitHub shows them, `../CONTRACT.md`: that becomes `CONTRACT.md`;
- they link to the README, the site's front door: that becomes `index.md`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL_PAGES = ("CONTRACT.md", "ARCHITECTURE.md")


def rewrite_links(markdown: str, *, top_level: bool) -> str:
    """Links across the docs/ boundary, as they must read inside the site."""
    if top_level:
        return re.sub(r"\]\(README\.md(#[^)]*)?\)", r"](index.md\1)", markdown)
    names = "|".join(re.escape(name) for name in TOP_LEVEL_PAGES)
    return re.sub(rf"\]\(\.\./({names})(#[^)]*)?\)", r"](\1\2)", markdown)


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    for name in TOP_LEVEL_PAGES:
        files.append(File.generated(config, name, content=(ROOT / name).read_text("utf-8")))
    return files


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    return rewrite_links(markdown, top_level=page.file.src_uri in TOP_LEVEL_PAGES)
