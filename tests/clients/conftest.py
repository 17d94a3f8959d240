"""Shared by the real-client tests (tests/clients): where snip's programs and
the prepared KJV test data are, and a helper to run snip.

CTest passes them as environment variables (tests/clients/CMakeLists.txt):
SNIP_BIN (the snip program), SNIP_CODEC_DUMP (tests/clients/codec_dump),
SNIP_DATA (the kjv512 data folder, BPE vocabulary 512). Run by hand:

    SNIP_BIN=build/snip SNIP_CODEC_DUMP=build/tests/clients/codec_dump \\
    SNIP_DATA=build/test-data/kjv512 .venv/bin/python -m pytest tests/clients
"""
import os
import subprocess

import pytest


def _env(name):
    v = os.environ.get(name)
    if not v:
        pytest.fail(f"{name} is not set: run through ctest, or set it (see tests/clients/conftest.py)")
    return v


@pytest.fixture(scope="session")
def snip_bin():
    return _env("SNIP_BIN")


@pytest.fixture(scope="session")
def codec_dump():
    return _env("SNIP_CODEC_DUMP")


@pytest.fixture(scope="session")
def data_dir():
    d = _env("SNIP_DATA")
    if not os.path.exists(os.path.join(d, "train.bin")):
        pytest.fail(f"{d} holds no prepared data (the CTest fixture prepare_kjv512 makes it)")
    return d


def run_snip(snip_bin, *args, check=True, timeout=600):
    """Runs `snip ARGS`; returns the CompletedProcess (text). With check, a
    non-zero exit fails the test with snip's stderr."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    p = subprocess.run([snip_bin, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        pytest.fail(f"snip {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p
