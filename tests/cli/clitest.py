"""Shared by the Python CLI tests (tests/cli/*.py): the micro model's
configuration, running the real `snip` binary, and the checks every test
counts (pass/fail tallies, "exit 2 with one error line, nothing changed").
"""
import hashlib
import os
import socket
import subprocess
import sys


def free_port():
    """A TCP port free on 127.0.0.1 now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def micro_toml(path, data_dir, extra="", seq_len=16):
    """Writes the micro model of tests/cli/micro_toml.sh (C = 32, one layer,
    B = 2, one thread) training on `data_dir`; `extra` (TOML lines) ends the
    [train] table and may open further tables."""
    with open(path, "w") as f:
        f.write(f"""[model]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1
max_position_embeddings = 32
[data]
dir = "{data_dir}"
[train]
batch_size = 2
seq_len = {seq_len}
threads = 1
device = "cpu"
{extra}
""")


def snapshot(folder):
    """Every file under folder -> SHA-256 of its bytes (but the lock file,
    which holds the pid of the last process that took it)."""
    out = {}
    for root, _, files in os.walk(folder):
        for n in files:
            if n == ".lock":
                continue
            p = os.path.join(root, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


class Checks:
    """Runs `snip` and tallies checks; finish() prints the tally and exits
    1 if any failed."""

    def __init__(self, snip):
        self.snip = snip
        self.passed = 0
        self.failures = []

    def run(self, args, timeout=60):
        """(exit status or "timeout", stdout, stderr) of `snip ARGS`."""
        try:
            p = subprocess.run([self.snip] + list(args), capture_output=True, text=True, timeout=timeout)
            return p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            return "timeout", "", ""

    def check(self, ok, name, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failures.append(name)
            print(f"FAIL {name}: {detail}", file=sys.stderr)

    def expect_error(self, name, args, needle, untouched=None, absent=None):
        """Exit 2, exactly one stderr line 'snip: error: ...' holding needle;
        `untouched` (a folder) is byte-identical afterwards; `absent` does
        not exist."""
        before = snapshot(untouched) if untouched else None
        rc, out, err = self.run(args)
        lines = err.splitlines()
        ok = rc == 2 and len(lines) == 1 and lines[0].startswith("snip: error: ") and needle in lines[0]
        self.check(ok, name, f"rc={rc} want 2, stderr={err!r}, want one line with {needle!r}")
        if untouched:
            self.check(snapshot(untouched) == before, name + " (run folder unchanged)", "files changed")
        if absent:
            self.check(not os.path.exists(absent), name + " (nothing left behind)", absent + " exists")

    def finish(self):
        print(f"{self.passed} passed, {len(self.failures)} failed")
        sys.exit(1 if self.failures else 0)
