"""The torture run's options, its command line (deploy/local/torture --help) and what one cycle
records (tests/support/torture.py runs them)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import torture_checks as tc


@dataclass
class Options:
    cycles: int
    seconds_per_cycle: float
    seed: int
    report: Path | None = None
    faults: tuple[str, ...] = tc.CHOICES
    workers: int = 2
    pause_s: float = 0.25
    trigger: str = "3 seconds"
    recovery_timeout_s: float = 600.0
    aim_timeout_s: float = 90.0
    # A fault waits this long for the consumer's next batch since the previous fault (a cycle
    # counts only with one), then strikes anyway; 0: strike on schedule.
    commit_wait_s: float = 600.0
    work_dir: Path | None = None
    keep: bool = False
    check_only: bool = False  # only the checks, on what a run left in work_dir


@dataclass
class CycleResult:
    number: int
    faults: list[str]
    at_s: float
    schema_change: str | None = None
    details: list[dict[str, Any]] = field(default_factory=list)
    recovery_s: float | None = None
    error: str | None = None
    kinds: list[str] = field(default_factory=list)  # the faults' kinds ("double" for two)
    counted: bool = True  # a new progress row since the previous fault, when this one struck
    waited_for_batch_s: float = 0.0  # how long the fault waited for that row
    progress_rows_at_fault: int = 0
    progress_rows_after_fault: int = 0


def parse(argv: list[str]) -> Options:
    width = max(len(k) for k in tc.KIND_HELP)
    p = argparse.ArgumentParser(
        prog="deploy/local/torture",
        description="Faults drawn from a seed strike the running pipeline cycle after cycle; "
        "then nothing may be lost, diverged or half-visible in the lake.",
        epilog="fault kinds (--faults; a network fault strikes one link, through Toxiproxy:\n"
        f"{', '.join(tc.LINKS)}):\n"
        + "\n".join(f"  {k:<{width}}  {h}" for k, h in tc.KIND_HELP.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cycles", type=int, required=True)
    p.add_argument("--seconds-per-cycle", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--report", type=Path, help="write the JSON report here")
    p.add_argument(
        "--faults",
        default=",".join(tc.CHOICES),
        help="fault kinds to strike, comma-separated, each as often as the others (default: every kind; listed below)",
    )
    p.add_argument("--workers", type=int, default=2, help="load threads (default 2)")
    p.add_argument(
        "--pause-s", type=float, default=0.25, help="pause between a worker's transactions"
    )
    p.add_argument("--trigger", default="3 seconds", help="the consumer's trigger interval")
    p.add_argument("--recovery-timeout-s", type=float, default=600.0)
    p.add_argument(
        "--commit-wait-s",
        type=float,
        default=600.0,
        help="a fault first waits this long for the consumer's next batch since the previous "
        "fault (a cycle counts only with one), then strikes anyway; 0: on schedule",
    )
    p.add_argument(
        "--aim-timeout-s",
        type=float,
        default=90.0,
        help="a consumer kill waits this long for its moment (a MERGE, the progress write), "
        "then strikes anyway (reported as not aimed)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        help="lake, checkpoint, logs (default under WALBRIDGE_HOME/torture)",
    )
    p.add_argument("--keep", action="store_true", help="keep the slot and publication afterwards")
    p.add_argument(
        "--check-only",
        action="store_true",
        help="run only the final checks on what the run in --work-dir left (same --seed, "
        "--cycles, --seconds-per-cycle): for a run that was interrupted",
    )
    a = p.parse_args(argv)
    if a.cycles < 1 or a.seconds_per_cycle <= 0:
        p.error("--cycles must be >= 1 and --seconds-per-cycle > 0")
    try:
        faults = tc.parse_faults(a.faults)
    except ValueError as exc:
        p.error(f"--faults: {exc}")
    return Options(
        a.cycles, a.seconds_per_cycle, a.seed, a.report, faults, a.workers,
        a.pause_s, a.trigger, a.recovery_timeout_s, a.aim_timeout_s, a.commit_wait_s,
        a.work_dir, a.keep, a.check_only,
    )  # fmt: skip
