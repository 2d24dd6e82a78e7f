#!/usr/bin/env bash
# Set up what is missing or changed (installer/setup.sh: nothing to do and ~0.05 s on a machine already set up),
# then launch Kestrel on the embedded default model. Arguments go to the app (e.g. --panel models).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/installer/setup.sh"
exec "${KESTREL_VENV:-$here/.venv}/bin/kestrel" "$@"
