"""The Python package's tests (docs/python.md): they import python/snip from
the source tree with the operators built in the CMake build folder
(SNIP_OPS_LIBRARY, set by tests/python/CMakeLists.txt)."""
import os
import subprocess

import pytest


@pytest.fixture(scope="session")
def snip_bin():
    b = os.environ.get("SNIP_BIN")
    if not b:
        pytest.skip("SNIP_BIN is not set (run through ctest)")
    return b


def run_snip(snip_bin, *args):
    p = subprocess.run([snip_bin, *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout
