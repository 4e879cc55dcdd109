"""The benchmarks' shared helpers: /proc parsing (tests/bench/proc_usage.py), result files
(bench_output.py) and plots (plots.py), on synthetic input: benchmarks themselves never run in
the test suite."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.bench import bench_output, plots, proc_usage

pytestmark = pytest.mark.unit

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_busy_ticks_count_work_not_idle_iowait_or_steal() -> None:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    stat = "cpu  100 20 30 5000 400 6 7 800 0 0\ncpu0 50 10 15 2500 200 3 3 400 0 0\n"
    assert proc_usage.busy_ticks(stat) == 100 + 20 + 30 + 6 + 7


def test_task_stat_reads_a_name_with_spaces_and_parentheses() -> None:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    stat = "4242 (C2 Compiler) (x)) S 1 4242 4242 0 -1 4194304 10 0 0 0 250 50 0 0 20 0 30"
    parsed = proc_usage.task_stat(stat)
    assert parsed.name == "C2 Compiler) (x)"
    assert parsed.ticks == 300
    assert parsed.seconds == pytest.approx(300 / os.sysconf("SC_CLK_TCK"))


def test_status_kb_reads_one_field() -> None:
    status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    assert proc_usage.status_kb(status, "VmRSS") == 102400
    assert proc_usage.status_kb(status, "VmHWM") == 204800
    assert proc_usage.status_kb(status, "VmSwap") == 0


def test_the_readers_agree_with_this_process() -> None:
    pid = os.getpid()
    assert proc_usage.rss_kb(pid) > 0
    assert proc_usage.peak_rss_kb(pid) >= proc_usage.rss_kb(pid)
    assert proc_usage.process_cpu_s(pid) >= proc_usage.thread_cpu_s(pid, pid) > 0
    assert pid in proc_usage.threads(pid)
    assert proc_usage.machine_busy_s() > 0


def test_results_go_under_walbridge_home_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WALBRIDGE_BENCH_RESULTS", raising=False)
    monkeypatch.setenv("WALBRIDGE_HOME", str(tmp_path))
    base = bench_output.run_base("bench_x", at=0)
    assert base == tmp_path / "bench-results" / "bench_x-19700101T000000Z"
    path = bench_output.write_json(base, {"seconds": 1.5, "where": tmp_path})
    assert path == base.with_suffix(".json")
    assert json.loads(path.read_text()) == {"seconds": 1.5, "where": str(tmp_path)}


def test_series_plot_writes_a_png(tmp_path: Path) -> None:
    path = plots.series_plot(
        tmp_path / "batches.png",
        {
            "batch seconds": [(i * 10.0, 5.0 + i % 3) for i in range(20)],
            "seconds per 100k transactions": [(i * 10.0, 4.0) for i in range(20)],
        },
        title="synthetic",
        xlabel="s",
        ylabel="s",
        markers=True,
    )
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_distribution_plot_writes_a_png(tmp_path: Path) -> None:
    values = [0.5 + (i % 37) / 10 for i in range(1000)]
    path = plots.distribution_plot(
        tmp_path / "freshness.png",
        values,
        title="synthetic",
        xlabel="s",
        marks={"p50": 2.3, "p99": 4.0},
    )
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
