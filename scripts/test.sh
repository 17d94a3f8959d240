#!/usr/bin/env bash
# Builds and runs the whole test suite (CTest: GoogleTest cases, the float64
# PyTorch reference, CLI checks). Installs what it needs first (setup.sh).
#
# usage: scripts/test.sh [extra ctest arguments, e.g. -R Reference]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build="${SNIP_BUILD_DIR:-build}"
# The venv first on PATH: the tests' python3 and torchrun are its own.
export PATH="$PWD/.venv/bin:$PATH"
# ctest runs tests in parallel: OpenMP threads must not spin on shared cores.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# Label `timing` (GEMM-time checks, meaningful on an idle machine only) is
# left out of the default run: `ctest --test-dir build -L timing` runs it.
[ $# -gt 0 ] || set -- -LE timing
exec ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
