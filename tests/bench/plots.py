"""The benchmarks' plots: PNG files written with matplotlib's Agg backend (no display needed),
beside the run's JSON result (bench_output.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: a file renderer, whatever the environment says

import matplotlib.pyplot as plt


def series_plot(
    path: Path,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    markers: bool = False,
) -> Path:
    """One line per named series of (x, y) points, on shared axes; returns ``path``."""
    fig, ax = plt.subplots(figsize=(10, 5), layout="constrained")
    try:
        for label, points in series.items():
            xs, ys = zip(*points, strict=True) if points else ((), ())
            ax.plot(xs, ys, label=label, marker="o" if markers else None, markersize=3)
        _finish(ax, title, xlabel, ylabel, legend=len(series) > 1)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def distribution_plot(
    path: Path,
    values: Sequence[float],
    *,
    title: str,
    xlabel: str,
    marks: Mapping[str, float] | None = None,
    bins: int = 50,
) -> Path:
    """A histogram of ``values`` with a vertical line at each mark (e.g. p50, p99)."""
    fig, ax = plt.subplots(figsize=(10, 5), layout="constrained")
    try:
        ax.hist(values, bins=bins, color="tab:blue", alpha=0.8)
        for i, (label, x) in enumerate((marks or {}).items()):
            ax.axvline(x, color=f"C{i + 1}", linestyle="--", label=f"{label} {x:.2f}")
        _finish(ax, title, xlabel, "count", legend=bool(marks))
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def _finish(ax: plt.Axes, title: str, xlabel: str, ylabel: str, *, legend: bool) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend()
