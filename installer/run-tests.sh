#!/usr/bin/env bash
# Set up everything (first run) and run the whole test suite (docs/TESTING.md). Extra arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/installer/setup.sh" --test
cd "$here"
export QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1
set +e
# two workers (pytest-xdist; groups and order: tests/support/xdist_plan.py); `-n 0` after it runs one process
"${KESTREL_VENV:-$here/.venv}/bin/python" -m pytest -ra --durations=25 -n 2 --dist loadgroup "$@"  # the slowest 25 close the output (docs/TESTING.md)
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "[kestrel tests] pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit $rc
