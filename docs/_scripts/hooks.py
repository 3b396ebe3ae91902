"""MkDocs hooks for the docs build: pictures that live elsewhere in the repository, and a check
of the 404 page.

The benchmark plots stay where the benchmarks write them (benchmarks/results/*.png) and the web
view's screenshot beside its code (examples/web/screenshot.png); this adds them to the site
under images/, so the pages show what the last run measured and nothing is copied by hand.

The API reference names no private module or class (``nous_session._json``, ``Bases: _Range``)
and no constructor it calls not public, in the text a reader sees: the build fails otherwise.

The 404 page is served at whatever path was missing (``/a/b/c``), so a relative link in it
leads nowhere: after the build, every link, script, stylesheet and the theme's ``base`` of
404.html must start at the site's root (or be absolute, or an anchor), or the build fails.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

_LINK = re.compile(r'(?:href|src)="([^"]*)"|"base": "([^"]*)"')
_FROM_ROOT = ("/", "#", "http://", "https://", "mailto:", "data:")
_TAG = re.compile(r"<[^>]+>")
_PRIVATE = re.compile(r"nous_session(?:\.\w+)*\._(?!_)\w+|Bases:\s+[^\n]*\b_[A-Za-z]\w*|not public")


def on_files(files: Files, config: Any) -> Files:
    """Add the benchmark plots and the web view's screenshot to the site's files."""
    root = Path(config.config_file_path).parent
    pictures = sorted((root / "benchmarks" / "results").glob("*.png"))
    pictures.append(root / "examples" / "web" / "screenshot.png")
    for picture in pictures:
        files.append(File.generated(config, f"images/{picture.name}", abs_src_path=str(picture)))
    return files


def on_post_build(config: Any) -> None:
    """Fail the build when the API reference shows something private, or the 404 page holds a
    relative link (see the module docstring)."""
    site = Path(config.site_dir)
    for reference in sorted((site / "reference").rglob("*.html")):
        text = html.unescape(_TAG.sub(" ", reference.read_text(encoding="utf-8")))
        private = sorted({match.group(0) for match in _PRIVATE.finditer(text)})
        if private:
            raise PluginError(
                f"{reference.relative_to(site)}: the API reference shows what is private: "
                f"{private}"
            )
    page = site / "404.html"
    if not page.exists():
        return
    found = [a or b for a, b in _LINK.findall(page.read_text(encoding="utf-8"))]
    relative = sorted({link for link in found if not link.startswith(_FROM_ROOT)})
    if not found or relative:
        raise PluginError(
            f"404.html: links that do not start at the site's root: {relative or 'no links'};"
            " they break when the page is served at a deeper path"
        )
