"""A real `pcd batch` process, killed with SIGKILL mid-job and restarted, on the embedded model."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pcd_tools.batch import work_dir

from .helpers import read, texts, write_csv

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ROWS, CHUNK = 30, 5


def _cmd(src: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pcd_tools",
        "batch",
        "--schema",
        "tests.batch.schemas:Route",
        "--input",
        str(src),
        "--output",
        str(out),
        "--chunk-rows",
        str(CHUNK),
        "--batch-size",
        str(CHUNK),
        *extra,
    ]


def _run(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _parts(out: Path) -> list[Path]:
    return sorted(work_dir(out).glob("part-*.parquet"))


def test_sigkill_mid_job_then_restart_equals_an_uninterrupted_run(tmp_path):
    short = [t[:48] for t in texts(ROWS)]
    src = write_csv(tmp_path / "in.csv", [{"id": f"m{i}", "text": t} for i, t in enumerate(short)])
    out = tmp_path / "killed.parquet"
    proc = subprocess.Popen(
        _cmd(src, out, "--quiet"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 240
    while len(_parts(out)) < 2:
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline, "no chunk was committed in time"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    done = len(_parts(out))
    assert 2 <= done < ROWS // CHUNK, "the job must be killed mid-way"
    assert not out.exists()

    resumed = _run(_cmd(src, out, "--json"))
    assert resumed["skipped"] == done * CHUNK
    assert resumed["decided"] == ROWS - done * CHUNK and resumed["rows"] == ROWS
    assert resumed["errors"] == 0
    assert not work_dir(out).exists()

    straight = tmp_path / "straight.parquet"
    assert _run(_cmd(src, straight, "--json"))["skipped"] == 0
    got, want = read(out), read(straight)
    assert [r["id"] for r in got] == [f"m{i}" for i in range(ROWS)]  # each row exactly once
    for a, b in zip(got, want):
        assert (a["id"], a["billing"], a["urgency"]) == (b["id"], b["billing"], b["urgency"])
        for col in ("billing__p", "urgency__p", "confidence"):
            # float32 passes of other batch shapes: the project's 1e-4
            assert math.isclose(a[col], b[col], abs_tol=1e-4), (col, a, b)
