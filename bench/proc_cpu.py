"""CPU time by process group, read from ``/proc`` (Linux): what each side of a benchmark
spent, whatever else the machine is running.

On a shared 2-core machine a rate measures the load as much as the code; the CPU a
process spent per operation does not (much). ``Groups`` names process trees (the service
and its workers, PgBouncer, the PostgreSQL postmaster and its backends, the load
generator) and ``snapshot()`` gives each one's user + system seconds so far, the time of
exited children included (``cutime``/``cstime``: a backend that ended is counted by its
postmaster once reaped).
"""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, own CPU s, reaped children's CPU s) of ``pid``; None once gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    # fields[0] is the state (stat field 3): utime is field 14, so fields[11]
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return ppid, (utime + stime) / TICK, (cutime + cstime) / TICK


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant, plus what its reaped children
    (and theirs) spent."""
    stats: dict[int, tuple[int, float, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                stats[int(entry)] = found
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            _, own, reaped = stats[pid]
            total += own + reaped
            todo.extend(children.get(pid, ()))
    return total


def parent_of(pid: int) -> int | None:
    found = _stat(pid)
    return None if found is None else found[0]


def own_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` alone (all its threads), not its children."""
    found = _stat(pid)
    return 0.0 if found is None else found[1]


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every core, every process: the
    other sessions' load included), from ``/proc/stat``."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


#: The name ``Groups.snapshot`` gives the whole machine's busy time.
MACHINE = "machine"


class Groups:
    """Processes by name: ``snapshot()`` → {name: CPU seconds so far}. A root is a whole
    process tree (``tree=True``: a server and its workers or backends) or one process
    (the load generator, whose children are the servers it started)."""

    def __init__(self) -> None:
        self.roots: dict[str, tuple[int, bool]] = {}

    def add(self, name: str, pid: int, *, tree: bool = True) -> None:
        self.roots[name] = (pid, tree)

    def snapshot(self) -> dict[str, float]:
        """Each group's CPU seconds so far, and the machine's (``MACHINE``)."""
        out = {
            name: tree_cpu(pid) if tree else own_cpu(pid)
            for name, (pid, tree) in self.roots.items()
        }
        out[MACHINE] = machine_busy()
        return out

    @staticmethod
    def per_op(before: dict[str, float], after: dict[str, float], ops: int) -> dict[str, float]:
        """Milliseconds of CPU per operation in each group between two snapshots."""
        return {name: (after[name] - before[name]) * 1000 / ops for name in before}
