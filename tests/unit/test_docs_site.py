"""The documentation site: it builds strictly, reads offline, and its generated reference is right.

`mkdocs build --strict` fails on any warning: a broken link or anchor, a page left out of the
navigation, and (docs/hooks/offline_site.py) any asset the built site would fetch from another
host. The hooks' pure parts are tested here on small inputs, including ones that must fail.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from schemas.settings_loader import declared, setting

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "docs" / "hooks"


def _hook(name: str) -> ModuleType:
    # The hooks are files MkDocs loads by path, not a package; load them the same way.
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


offline_site = _hook("offline_site")
settings_reference = _hook("settings_reference")
top_level_pages = _hook("top_level_pages")


def test_the_site_builds_strictly_and_offline(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # material's banner, not a build warning
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "WARNING" not in result.stderr, result.stderr[-4000:]
    # The hook ran in the build above; checked again here so a hook left out of mkdocs.yml fails.
    assert offline_site.remote_assets_in_site(site) == {}
    for page in ("index.html", "configuration.html", "benchmarks.html"):
        assert (site / page).is_file(), page
    reference = (site / "configuration.html").read_text("utf-8")
    for name in ("WALBRIDGE_PG_DSN", "WALBRIDGE_LAKE_PATH", "WALBRIDGE_SPARK_MASTER"):
        assert name in reference, name
    assert (site / "CONTRACT.html").is_file()
    assert (site / "ARCHITECTURE.html").is_file()


@pytest.mark.parametrize(
    "html",
    [
        '<script src="https://cdn.example.com/app.js"></script>',
        "<script src=//cdn.example.com/app.js></script>",
        '<link rel="stylesheet" href="http://cdn.example.com/site.css">',
        '<link rel="preconnect" href="https://fonts.gstatic.com">',
        '<img src="https://example.com/plot.png">',
        '<iframe src="https://example.com/embed"></iframe>',
        "<style>@import url(https://example.com/x.css);</style>",
        "<style>body { background: url('https://example.com/bg.png') }</style>",
        '<div style="background: url(http://example.com/bg.png)"></div>',
    ],
)
def test_a_remote_asset_in_html_is_found(html: str) -> None:
    assert offline_site.remote_assets_in_html(f"<html><body>{html}</body></html>")


def test_local_assets_and_hyperlinks_are_fine() -> None:
    html = (
        '<link rel="stylesheet" href="assets/stylesheets/main.css">'
        '<link rel="canonical" href="https://walbridge.example.org/">'
        '<script src="../assets/javascripts/bundle.js"></script>'
        '<a href="https://www.postgresql.org/docs/">PostgreSQL</a>'
        '<img src="plots/catchup.png">'
    )
    assert offline_site.remote_assets_in_html(html) == []


@pytest.mark.parametrize(
    "css",
    [
        '@import "https://fonts.googleapis.com/css?family=Roboto";',
        "@font-face { src: url(https://example.com/f.woff2) format('woff2') }",
        'a{background:url("//example.com/i.svg")}',
    ],
)
def test_a_remote_asset_in_css_is_found(css: str) -> None:
    assert offline_site.remote_assets_in_css(css)


def test_a_site_file_with_a_remote_asset_is_named(tmp_path: Path) -> None:
    (tmp_path / "page").mkdir()
    (tmp_path / "page" / "index.html").write_text('<script src="https://x.example/a.js"></script>')
    (tmp_path / "ok.css").write_text("a { background: url(img/local.png) }")
    found = offline_site.remote_assets_in_site(tmp_path)
    assert list(found) == [Path("page/index.html")]


@dataclass(frozen=True)
class _Example:
    dsn: str = setting(help="libpq DSN | with a <placeholder>", secret=True)
    prefix: str = setting("shop", help="topic *prefix*")
    create_topics: bool = setting(True, help="create topics")
    tables: str = setting("", help="schema.table,...")


def test_the_reference_renders_each_setting_as_help_shows_it() -> None:
    table = settings_reference.render_table(declared(_Example))
    lines = table.splitlines()
    assert lines[0] == "| variable | flag | default | description |"
    assert lines[2] == (
        "| `WALBRIDGE_DSN` | `--dsn` | required | libpq DSN \\| with a &lt;placeholder\\> "
        "(secret: never shown) |"
    )
    assert lines[3] == "| `WALBRIDGE_PREFIX` | `--prefix` | `shop` | topic \\*prefix\\* |"
    assert lines[4] == (
        "| `WALBRIDGE_CREATE_TOPICS` | `--create-topics`, `--no-create-topics` | `True` | "
        "create topics |"
    )
    assert lines[5] == "| `WALBRIDGE_TABLES` | `--tables` | unset | schema.table,... |"


def test_variables_only_settings_have_no_flag_column() -> None:
    table = settings_reference.render_table(declared(_Example), has_flags=False)
    assert table.splitlines()[0] == "| variable | default | description |"
    assert "`--prefix`" not in table


def test_the_reference_has_a_section_per_command_and_lists_the_other_names() -> None:
    command = settings_reference.Command("tool run", "x:Y", "What it does.")
    text = settings_reference.render_reference(
        [(command, declared(_Example))], ["WALBRIDGE_B_FILE", "WALBRIDGE_A_FILE"], ["WALBRIDGE_X"]
    )
    assert text.startswith("## tool run\n\nWhat it does.\n\n| variable |")
    assert text.index("`WALBRIDGE_A_FILE`") < text.index("`WALBRIDGE_B_FILE`")
    assert "- `WALBRIDGE_X`\n" in text


def test_every_declared_command_is_rendered() -> None:
    for command in settings_reference.COMMANDS:
        assert settings_reference._settings_of(command), command.name


def test_links_across_the_docs_boundary_are_rewritten() -> None:
    page = "see [the contract](../CONTRACT.md#lake), [home](../README.md), [x](../other.md)"
    assert top_level_pages.rewrite_links(page, top_level=False) == (
        "see [the contract](CONTRACT.md#lake), [home](index.md), [x](../other.md)"
    )
    readme = "[lake](docs/lake.md#verify), [map](ARCHITECTURE.md), [me](README.md)"
    assert top_level_pages.rewrite_links(readme, top_level=True) == (
        "[lake](lake.md#verify), [map](ARCHITECTURE.md), [me](index.md)"
    )
