"""MkDocs hook: README.md, CONTRACT.md and ARCHITECTURE.md, which stay at the top level, as pages.

Code, tests and other repositories link to these files where they are, and the README is the
repository's front door, so none of them moves into docs/. At build time this hook adds them to
the site (read from the checkout, never copied into docs/): the README as the home page
`index.md`, the other two under their own names. It rewrites the links that cross the docs/
boundary so that the strict build checks them like any other:
- a docs page links to them as GitHub shows them, `../CONTRACT.md`: that becomes `CONTRACT.md`
  (`../README.md` becomes `index.md`);
- they link into the docs as `docs/lake.md`: that becomes `lake.md`, and to the README as
  `README.md`: that becomes `index.md`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
# Top-level file -> its page in the site.
TOP_LEVEL_PAGES = {
    "README.md": "index.md",
    "CONTRACT.md": "CONTRACT.md",
    "ARCHITECTURE.md": "ARCHITECTURE.md",
}


def rewrite_links(markdown: str, *, top_level: bool) -> str:
    """The Markdown links that cross the docs/ boundary, as they must read inside the site."""
    prefix = "" if top_level else r"\.\./"
    names = "|".join(re.escape(name) for name in TOP_LEVEL_PAGES)

    def to_page(match: re.Match[str]) -> str:
        return f"]({TOP_LEVEL_PAGES[match.group(1)]}{match.group(2) or ''})"

    markdown = re.sub(rf"\]\({prefix}({names})(#[^)]*)?\)", to_page, markdown)
    if top_level:
        markdown = re.sub(r"\]\(docs/", "](", markdown)
    return markdown


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    for source, page in TOP_LEVEL_PAGES.items():
        files.append(File.generated(config, page, content=(ROOT / source).read_text("utf-8")))
    return files


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    return rewrite_links(markdown, top_level=page.file.src_uri in TOP_LEVEL_PAGES.values())
