"""This process's cgroup: its CPU quota and its memory limit, read in one place.

`cgroup_quota()` is the CPU quota `cpus.usable_cpus` sizes thread pools by;
`available_memory()` the memory the native decode's copy decision and a model's load see
(MemAvailable, and no more than the cgroup's limit leaves). Both read cgroup v2 first,
then v1, and take an unreadable or malformed file as no limit.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CGROUP_ROOT", "available_memory", "cgroup_quota"]

CGROUP_ROOT = Path("/sys/fs/cgroup")  # the cgroup file system (a test points it elsewhere)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _own_cgroup(proc_cgroup: str | None) -> tuple[str | None, dict[str, str]]:
    """This process's cgroup v2 path, and its v1 paths by controller."""
    v2, v1 = None, {}
    for line in (proc_cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            v2 = path
        for c in ctrls.split(","):
            if c:
                v1[c] = path
    return v2, v1


def cgroup_quota(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """The CPU quota of this process's cgroup, in CPUs, or None for no quota.

    Reads cgroup v2's `cpu.max` in this process's cgroup and then the root (where a
    container sees its own cgroup mounted), else cgroup v1's CFS files. An unreadable or
    malformed file counts as no quota.

    Args:
        root: The cgroup mount point.
        proc_cgroup: The text of `/proc/self/cgroup` (read when None).
    """
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup"))
    v2, v1 = _own_cgroup(proc_cgroup)
    dirs = [root / v2.lstrip("/")] if v2 and v2 != "/" else []
    for d in [*dirs, root]:
        text = _read(d / "cpu.max")
        if text is None:
            continue
        parts = text.split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                quota, period = int(parts[0]), int(parts[1])
            except ValueError:
                return None
            return quota / period if quota > 0 and period > 0 else None
        return None
    cpu = v1.get("cpu") or v1.get("cpuacct")
    for d in ([root / "cpu" / cpu.lstrip("/")] if cpu else []) + [
        root / "cpu",
        root / "cpu,cpuacct",
    ]:
        q, p = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        if q is None or p is None:
            continue
        try:
            quota, period = int(q), int(p)
        except ValueError:
            return None
        return quota / period if quota > 0 and period > 0 else None
    return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None  # "max": no limit


def available_memory(root: Path | None = None) -> int:
    """Bytes of memory available now: MemAvailable (the physical size where unknown), and
    no more than this process's cgroup leaves under its limit (v2 `memory.max` less
    `memory.current`, or v1 `memory.limit_in_bytes` less `memory.usage_in_bytes`)."""
    root = CGROUP_ROOT if root is None else root
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        try:
            avail = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            avail = 1 << 62
    for limit, used in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        cap, cur = _read_int(root / limit), _read_int(root / used)
        if cap is not None and cur is not None and cap < 1 << 60:  # v1 writes a huge "no limit"
            avail = min(avail, max(0, cap - cur))
    return avail
