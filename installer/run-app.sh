#!/usr/bin/env bash
# Set up everything (first run) and launch Kestrel on the embedded default model.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/installer/setup.sh"
exec "${KESTREL_VENV:-$here/.venv}/bin/kestrel" "$@"
