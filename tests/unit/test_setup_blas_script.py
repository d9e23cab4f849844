"""`scripts/setup_blas.sh` changes nothing on the system (issue 34).

Run as root on a busy machine it once measured the pip OpenBLAS slow and ran
`apt-get install` by itself. Here the BLAS is made slow for real (`PCD_BLAS=reference`),
package managers on PATH are replaced by recorders, and the script must re-measure once,
print the diagnosis and the command a user may run, and run none of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ("apt-get", "apt", "dpkg", "sudo", "yum", "dnf", "pip", "pip3")


def test_a_slow_blas_is_diagnosed_twice_and_nothing_is_installed(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    for name in RECORDED:
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\nexit 0\n')
        tool.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "PCD_BLAS": "reference",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    env.pop("PCD_CACHE_DIR", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup_blas.sh"), sys.executable],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert not calls.exists(), calls.read_text()
    assert proc.stdout.count("setup_blas: reference ") == 2  # measured, then once more
    assert "measuring once more" in proc.stdout
    assert "MLX uses a slow BLAS on this Linux CPU" in proc.stderr  # the diagnosis
    assert "nothing was installed" in proc.stderr
    assert "you may run (as root, on Debian/Ubuntu): apt-get install libopenblas0-pthread" in (
        proc.stderr
    )


def test_the_script_has_no_package_manager_command_to_run():
    text = (ROOT / "scripts" / "setup_blas.sh").read_text()
    runnable = [
        line
        for line in text.splitlines()
        if "apt-get" in line and not line.lstrip().startswith(("#", '"'))
    ]
    assert runnable == []
