"""MkDocs hook: the built site must fetch nothing from the internet when it is viewed.

After the build, every HTML, CSS and JavaScript file of the site is scanned for a reference to a
remote asset (a script, stylesheet, font, image or frame loaded from another host); each one found
is logged as a warning, so `mkdocs build --strict` fails on it. Ordinary hyperlinks (`<a href>`)
are no assets and stay allowed. `remote_assets_in_html` and `remote_assets_in_css` are pure
(unit-tested on small strings that must fail).
"""

from __future__ import annotations

import logging
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig

log = logging.getLogger("mkdocs.hooks.offline_site")

# "http://", "https://" and protocol-relative "//host": anything that leaves the site.
_REMOTE = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
# Tag attributes that load something when the page is shown.
_LOADING_ATTRIBUTES = {
    "script": ("src",),
    "img": ("src", "srcset"),
    "iframe": ("src",),
    "frame": ("src",),
    "embed": ("src",),
    "object": ("data",),
    "source": ("src", "srcset"),
    "audio": ("src",),
    "video": ("src", "poster"),
    "track": ("src",),
    "input": ("src",),
}
# <link> rels that are no assets: metadata about the page.
_LINK_METADATA = {"canonical", "alternate", "author", "license", "next", "prev", "help", "search"}
# CSS (also inside JavaScript and <style>): url(...) and @import "..." pointing elsewhere.
_CSS_REMOTE = re.compile(
    r"""url\(\s*['"]?\s*((?:[a-z][a-z0-9+.-]*:)?//[^'")\s]+)"""
    r"""|@import\s+['"]((?:[a-z][a-z0-9+.-]*:)?//[^'"]+)""",
    re.IGNORECASE,
)
# Web-font services, named anywhere (a theme may build their URLs in code).
_FONT_SERVICES = re.compile(r"fonts\.(?:googleapis|gstatic)\.com|use\.typekit\.net", re.IGNORECASE)


class _AssetFinder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag == "link":
            rels = set(values.get("rel", "").lower().split())
            if not rels <= _LINK_METADATA and _REMOTE.match(values.get("href", "")):
                self.found.append(f"<link rel={values.get('rel')!r} href={values['href']!r}>")
        for attribute in _LOADING_ATTRIBUTES.get(tag, ()):
            value = values.get(attribute, "")
            if any(_REMOTE.match(part) for part in value.split(",")):
                self.found.append(f"<{tag} {attribute}={value!r}>")
        if "style" in values:
            self.found.extend(remote_assets_in_css(values["style"]))
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.found.extend(remote_assets_in_css(data))


def remote_assets_in_html(html: str) -> list[str]:
    """Each remote asset an HTML document loads (tags, inline styles, font services)."""
    finder = _AssetFinder()
    finder.feed(html)
    finder.close()
    return finder.found + _FONT_SERVICES.findall(html)


def remote_assets_in_css(text: str) -> list[str]:
    """Each remote asset a stylesheet (or a script that carries CSS) loads."""
    found = [first or second for first, second in _CSS_REMOTE.findall(text)]
    return found + _FONT_SERVICES.findall(text)


def remote_assets_in_site(site_dir: Path) -> dict[Path, list[str]]:
    """The remote assets of every HTML, CSS and JavaScript file under `site_dir`, by file."""
    out = {}
    for path in sorted(site_dir.rglob("*")):
        if path.suffix == ".html":
            found = remote_assets_in_html(path.read_text("utf-8"))
        elif path.suffix in (".css", ".js"):
            found = remote_assets_in_css(path.read_text("utf-8"))
        else:
            continue
        if found:
            out[path.relative_to(site_dir)] = found
    return out


def on_post_build(config: MkDocsConfig, **_: Any) -> None:
    for path, found in remote_assets_in_site(Path(config.site_dir)).items():
        for asset in found:
            log.warning("%s loads a remote asset (the site must work offline): %s", path, asset)
