#!/usr/bin/env bash
# One-shot GPU check of the fast paths (vectorised LeNet bank; ResNet-18 throughput; each wide
# network's bank K models at once against one after another; projected gpu- and paper-profile
# times), within --budget (255 s: what does not fit is named) and without internet.
# Run from anywhere:
#
#   benchmarks/gpu_smoke.sh            # the target sizes on the GPU (device auto)
#   benchmarks/gpu_smoke.sh --parts 2  # only part 2 (--parts 1,3,4: the rates), in that order
#   benchmarks/gpu_smoke.sh --tiny     # tiny sizes: checks the script itself, on a CPU too
#   benchmarks/gpu_smoke.sh --json rates.json   # also the rates, for bnmem_utils.run.work --adopt
#
# Extra arguments go to benchmarks/gpu_smoke.py (--help lists them). PYTHON overrides the
# interpreter (default: the checkout's .venv, else python3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# the checkout's own package, also where it is not installed (a bare GPU machine's image)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
fi
if command -v nvidia-smi >/dev/null; then
  echo "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
else
  echo "GPU: no nvidia-smi on this machine"
fi
exec "$py" benchmarks/gpu_smoke.py "$@"
