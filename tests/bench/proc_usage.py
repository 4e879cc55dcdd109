"""What /proc says the machine and its processes used: CPU (the whole machine's, a process's, a
thread's) and memory (RSS). One home for the benchmarks' /proc parsing; Linux only.

The parse functions take the file's text (pure, unit-tested on synthetic lines); the others read
/proc. CPU times in /proc are in clock ticks, `os.sysconf("SC_CLK_TCK")` per second.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def busy_ticks(proc_stat: str) -> int:
    """Ticks every CPU spent working, from /proc/stat's first (`cpu`) line: user, nice, system,
    irq and softirq; not idle, iowait or a hypervisor's steal."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(x) for x in proc_stat.split("\n", 1)[0].split()[1:8]
    )
    return user + nice + system + irq + softirq


@dataclass(frozen=True)
class TaskStat:
    """One process's or thread's /proc/<pid>[/task/<tid>]/stat: its name and CPU ticks."""

    name: str
    ticks: int  # utime + stime

    @property
    def seconds(self) -> float:
        return self.ticks / TICKS_PER_S


def task_stat(stat: str) -> TaskStat:
    """Parses a /proc/<pid>/stat line. The name sits between the first "(" and the last ")" and
    may hold either, or spaces; utime and stime are the 14th and 15th fields."""
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return TaskStat(name, int(fields[11]) + int(fields[12]))


def status_kb(status: str, field: str) -> int:
    """A memory field of /proc/<pid>/status in kB (`VmRSS`, `VmHWM`: the peak RSS), 0 if absent."""
    match = re.search(rf"^{field}:\s+(\d+) kB", status, flags=re.MULTILINE)
    return int(match.group(1)) if match else 0


def machine_busy_s() -> float:
    """Core-seconds every CPU of this machine spent working since boot: the difference around a
    phase is what that phase cost the whole machine (PostgreSQL, Kafka, this process...)."""
    return busy_ticks(Path("/proc/stat").read_text()) / TICKS_PER_S


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process, all its threads."""
    return task_stat(Path(f"/proc/{pid}/stat").read_text()).seconds


def thread_cpu_s(pid: int, tid: int) -> float:
    """CPU seconds of one thread (its main thread: ``tid == pid``)."""
    return task_stat(Path(f"/proc/{pid}/task/{tid}/stat").read_text()).seconds


def threads(pid: int) -> dict[int, TaskStat]:
    """Each live thread of a process, by thread id."""
    found: dict[int, TaskStat] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found[int(task.name)] = task_stat((task / "stat").read_text())
        except OSError:
            continue  # the thread ended meanwhile
    return found


def rss_kb(pid: int) -> int:
    """A process's resident memory now, in kB (0 once it is gone)."""
    try:
        return status_kb(Path(f"/proc/{pid}/status").read_text(), "VmRSS")
    except FileNotFoundError:
        return 0


def peak_rss_kb(pid: int) -> int:
    """A process's peak resident memory so far (VmHWM), in kB."""
    return status_kb(Path(f"/proc/{pid}/status").read_text(), "VmHWM")


class Busy:
    """Machine core-seconds spent during a `with` block (see machine_busy_s), less what the
    machine spends at rest over as long (`background`, cores busy: measure_background)."""

    def __init__(self, background: float) -> None:
        self.background = background

    def __enter__(self) -> Busy:
        self.began = machine_busy_s()
        self.wall = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *_: object) -> None:
        spent = machine_busy_s() - self.began
        self.seconds = max(0.0, spent - self.background * (time.perf_counter() - self.wall))


def measure_background(seconds: float = 5.0) -> float:
    """Cores busy while nothing of the benchmark runs (the stack at rest, anything else)."""
    began, wall = machine_busy_s(), time.perf_counter()
    time.sleep(seconds)
    return (machine_busy_s() - began) / (time.perf_counter() - wall)
