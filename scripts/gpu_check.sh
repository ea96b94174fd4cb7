#!/usr/bin/env bash
# A short device=cuda training of the default model on the toy corridor (no JVM), with a summary:
# seconds per iteration, peak GPU memory, the loss; exit 0 passed, 1 failed, 2 something missing.
#
#   scripts/gpu_check.sh                   # on a GPU machine, from anywhere
#   DEVICE=cpu scripts/gpu_check.sh        # the same on a CPU
#   LIMIT=480 METHOD=empo2 ENV_NAME=scienceworld MODEL=/path/to/model scripts/gpu_check.sh --set max_steps=5
#
# Settings and what it checks: scripts/gpu_check.py. It uses .venv/bin/python when there is one,
# else python3 (PYTHON=... picks another), and needs no install of the package (PYTHONPATH).
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-480}
export LIMIT
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout --kill-after=15 "$LIMIT" "$PYTHON" scripts/gpu_check.py "$@"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "gpu_check: FAILED - not finished within LIMIT=${LIMIT} s (the lines above show how far it got)"
  rc=1
fi
exit "$rc"
