"""Where a benchmark writes its result files, and its JSON result: one base name per run,
`<results dir>/<bench>-<UTC time>`, with `.json` and each plot's `.png` beside it.

The directory is `--results-dir` where a script has it, else `$WALBRIDGE_BENCH_RESULTS`, else
`$WALBRIDGE_HOME/bench-results` (WALBRIDGE_HOME defaulting to .walbridge/ in the checkout, as
the stack's; git-ignored).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def results_dir() -> Path:
    if explicit := os.environ.get("WALBRIDGE_BENCH_RESULTS"):
        return Path(explicit)
    return Path(os.environ.get("WALBRIDGE_HOME", str(ROOT / ".walbridge"))) / "bench-results"


def run_base(bench: str, directory: Path | None = None, at: float | None = None) -> Path:
    """The base path of this run's files (no suffix); the directory is created."""
    directory = results_dir() if directory is None else directory
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if at is None else at))
    return directory / f"{bench}-{stamp}"


def write_json(base: Path, result: dict[str, Any]) -> Path:
    """`<base>.json`, indented; values JSON lacks (a Path, a numpy number) as their str()."""
    path = base.with_suffix(".json")
    path.write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    return path
