#!/usr/bin/env bash
# Makes sure MLX gets a fast BLAS on Linux CPU (DESIGN §4), then prints what was found.
# Route 1 (no root needed): pip scipy-openblas32 (a dependency) + a shim compiled with cc.
# Route 2 (fallback, root only): Debian/Ubuntu libopenblas0-pthread.
set -euo pipefail
PY="${1:-python3}"
if [ "$(uname -s)" != "Linux" ]; then
  echo "setup_blas: $(uname -s): MLX uses the platform BLAS; nothing to do."
  exit 0
fi
check() { "$PY" -c 'from pcd_tools.engine.platform import blas_status as b; i=b(); print(f"setup_blas: {i.name} {i.gflops:.0f} GFLOP/s fast={i.fast}"); raise SystemExit(0 if i.fast else 1)'; }
if check; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup_blas: the pip route is not fast here; installing libopenblas0-pthread"
  (apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q libopenblas0-pthread >/dev/null; }) || true
  if check; then exit 0; fi
fi
echo "setup_blas: WARNING: no fast BLAS; MLX runs ~30x slower on CPU. See 'pcd models --doctor'." >&2
exit 0
