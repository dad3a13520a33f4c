#!/usr/bin/env bash
# Sets up, builds (release) and runs the main job with its embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
# The main job: with no arguments, `hyperion train` prepares the bundled corpus, trains
# the embedded `tiny` preset, saves a checkpoint under runs/, reports held-out perplexity
# and prints samples. Any arguments replace the command (e.g. `scripts/run.sh bench peak`).
if [ $# -eq 0 ]; then set -- train; fi
exec build/release/hyperion "$@"
