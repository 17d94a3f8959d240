#!/usr/bin/env bash
# The main job: set up, prepare the Brown Corpus, train the tiny Llama on it.
# Idempotent: setup and data preparation skip what is done; training starts a
# fresh run in runs/tiny (pass --resume to continue an interrupted one).
#
# usage: scripts/run.sh [extra `snip train` arguments, e.g. --set train.max_steps=100]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build="${SNIP_BUILD_DIR:-build}"
"$build/snip" data prepare --corpus brown --out data/brown
exec "$build/snip" train --config configs/tiny.toml --run-dir runs/tiny "$@"
