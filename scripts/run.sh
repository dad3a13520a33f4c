#!/usr/bin/env bash
# Sets up, builds (release) and runs the main job with its embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
# Until the trainer exists the main job is the machine peak measurement.
if [ $# -eq 0 ]; then set -- bench peak; fi
exec build/release/hyperion "$@"
