"""MkDocs hooks for the docs build: pictures that live elsewhere in the repository.

The benchmark plots stay where the benchmarks write them (benchmarks/results/*.png) and the web
view's screenshot beside its code (examples/web/screenshot.png); this adds them to the site
under images/, so the pages show what the last run measured and nothing is copied by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files


def on_files(files: Files, config: Any) -> Files:
    """Add the benchmark plots and the web view's screenshot to the site's files."""
    root = Path(config.config_file_path).parent
    pictures = sorted((root / "benchmarks" / "results").glob("*.png"))
    pictures.append(root / "examples" / "web" / "screenshot.png")
    for picture in pictures:
        files.append(File.generated(config, f"images/{picture.name}", abs_src_path=str(picture)))
    return files
