#!/usr/bin/env bash
# Installs everything snip needs on Debian 12 and builds it into build/
# (CMake + Ninja + ccache): Debian's packages with apt, then the project's
# Python environment .venv with pip from requirements.txt (PyTorch 2.11 from
# PyPI, whose LibTorch the C++ build uses, and the real consumers of snip's
# files that the tests run: transformers, peft, torchao, ml_dtypes,
# safetensors), then the Python package `snip` into .venv (pip install .).
# Idempotent: installs only missing packages, reinstalls the venv only when
# requirements.txt changed, rebuilds only what changed.
#
# usage: scripts/setup.sh [TARGET ...]   (from anywhere; works on the repo it is in)
#        TARGETs are Ninja targets (e.g. snip); none = everything (tests, benchmarks, and the clang fuzz build in BUILD/fuzz)
# env:   SNIP_BUILD_DIR (default build), SNIP_BUILD_TYPE (default Release),
#        SNIP_EXTRA_PACKAGES (more apt packages, e.g. for the report tests),
#        SNIP_BOOTSTRAP_PYTHON (the python3 that makes .venv; default python3)
# needs: the CUDA 13 toolkit in /usr/local/cuda (nvcc; LibTorch's CMake files
#        of the CUDA wheel look for it: CUDA code compiles here, runs where a GPU is)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  python3 python3-venv                    # makes .venv (LibTorch comes from its torch wheel)
  libopenblas-dev                         # FP32 GEMMs on AMD CPUs (src/model/blas.cpp; the wheel's MKL is slower there)
  coinor-libcbc-dev                       # MILP solver for the precision planner
  libsentencepiece-dev sentencepiece      # tokenizer
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libcpp-httplib-dev
  zlib1g-dev libssl-dev                   # checkpoint CRC32, SHA-256 of data inputs
  libboost-dev                            # Boost.Math headers: Student-t quantiles of the experiment statistics
  libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev                             # Gloo headers: the wheel has c10d's ProcessGroupGloo.hpp, not gloo/ (src/dist)
  bible-kjv bible-kjv-text                # the default corpus: the King James Bible (public domain)
  wordnet-base                            # the second corpus: WordNet 3.0 glosses (LoRA demo)
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
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# The Python environment: one torch (the wheel's LibTorch for the C++ build,
# torchrun, the references of the tests), pinned with everything it pulls in.
venv=.venv
want="$(sha256sum requirements.txt | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating the Python environment $venv" >&2
  "${SNIP_BOOTSTRAP_PYTHON:-python3}" -m venv "$venv" >&2
fi
if [ "$(cat "$venv/requirements.sha256" 2>/dev/null)" != "$want" ]; then
  echo "setup: pip install -r requirements.txt into $venv (the first time about 3 GB: torch with its CUDA libraries)" >&2
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -r requirements.txt >&2
  echo "$want" >"$venv/requirements.sha256"
fi

build="${SNIP_BUILD_DIR:-build}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${SNIP_BUILD_TYPE:-Release}" >&2
fi
# 2 parallel jobs: LibTorch translation units take ~1.5 GiB each to compile.
ninja -C "$build" -j "${SNIP_JOBS:-$(nproc)}" "$@" >&2

# The Python package `snip` (pyproject.toml, docs/python.md) into .venv:
# scikit-build-core reuses $build, so it compiles nothing the step above
# built. Skipped while the package files and the operators are those it
# installed last (a stamp of their SHA-256). Not when TARGETs are named.
if [ $# -eq 0 ]; then
  stamp() { cat pyproject.toml python/snip/*.py "$build/python/_snip_ops.so" | sha256sum | cut -d' ' -f1; }
  if [ "$(cat "$venv/snip-package.sha256" 2>/dev/null)" != "$(stamp)" ]; then
    echo "setup: pip install . (the Python package snip) into $venv" >&2
    # The build type $build was configured with (not the environment's now):
    # another one would reconfigure and rebuild the whole folder.
    type="$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt")"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-build-isolation --no-deps \
      --config-settings=build-dir="$build" --config-settings=cmake.build-type="${type:-Release}" \
      --config-settings=build.tool-args="-j${SNIP_JOBS:-$(nproc)}" . >&2
    stamp >"$venv/snip-package.sha256"
  fi
fi

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
