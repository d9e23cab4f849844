#!/usr/bin/env bash
# Checks that MLX gets a fast BLAS on Linux CPU (DESIGN §4) and prints what was found.
#
# It changes nothing on the system: no package manager, no writes outside the venv and the
# user cache (where the package builds its BLAS shim). The package does the same binding
# and check itself on first use, so a `pip install` needs no script; `pcd models --doctor`
# reports it. When the BLAS measures slow, it measures once more (a busy moment?), then
# prints the diagnosis and, where reinstalling could help, a command the user may choose
# to run. It never runs it, and it always exits 0: a slow BLAS is a warning.
set -euo pipefail
PY="${1:-python3}"
if [ "$(uname -s)" != "Linux" ]; then
  echo "setup_blas: $(uname -s): MLX uses the platform BLAS; nothing to do."
  exit 0
fi
# One measurement in a fresh process (the BLAS is bound once per process, before mlx).
# Exit 0 when fast; with "final", print the diagnosis and the optional command when slow.
check() {
  "$PY" - "$1" <<'EOF'
import sys

from pcd_tools.engine.host.cpus import busy, cpu_budget
from pcd_tools.engine.host.blas import blas_status, slow_blas_message

info = blas_status()
print(f"setup_blas: {info.name} {info.gflops:.0f} GFLOP/s fast={info.fast}")
if info.fast:
    raise SystemExit(0)
if sys.argv[1] == "final":
    print(f"setup_blas: WARNING: {slow_blas_message(info)}", file=sys.stderr)
    if not (info.bound_before_import and busy(cpu_budget().cpus)[0]):
        print(
            "setup_blas: nothing was installed. If you want the system OpenBLAS, you may run "
            "(as root, on Debian/Ubuntu): apt-get install libopenblas0-pthread\n"
            "setup_blas: or point PCD_BLAS at an OpenBLAS or MKL library you already have. "
            "See `pcd models --doctor`.",
            file=sys.stderr,
        )
raise SystemExit(1)
EOF
}
if check first; then exit 0; fi
echo "setup_blas: slow; measuring once more in case the machine was busy"
check final || true
exit 0
