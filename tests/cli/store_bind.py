"""The rendezvous store rank 0 hosts listens on MASTER_ADDR:MASTER_PORT only
(docs/distributed.md "Network and threads"), not on every address: with
MASTER_ADDR=127.0.0.1, /proc/net/tcp shows exactly one listening socket on
the port, bound to 127.0.0.1 (not 0.0.0.0, and none in /proc/net/tcp6); the
two ranks then train to the end. A MASTER_ADDR that is not an address of
this machine (a NAT or service address; here TEST-NET-1, RFC 5737) makes
rank 0 listen on every address, as LibTorch's store does, with one warning
line naming it.

usage: store_bind.py SNIP DATA_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, free_port, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
c = Checks(snip)
tmp = tempfile.mkdtemp(prefix="snip-store-bind-")
cfg = os.path.join(tmp, "micro.toml")
micro_toml(cfg, data, "max_steps = 3\neval_interval = 1000\ncheckpoint_interval = 1000\n[dist]\ntimeout_s = 60\n"
           "[monitor]\nlisten = \"\"")


def env_for(rank, port, addr="127.0.0.1"):
    env = dict(os.environ)
    for k in ("SNIP_TEST_KILL", "SNIP_TEST_KILL_RANK", "SNIP_TEST_FAULT", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(k, None)
    env.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": addr, "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"})
    return env


def listeners(port):
    """(file, local address hex) of every LISTEN socket on `port`."""
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    addr, p = fields[1].split(":")
                    if int(p, 16) == port and fields[3] == "0A":  # 0A = TCP_LISTEN
                        out.append((name, addr))
        except FileNotFoundError:
            pass
    return out


def wait_listening(port, proc):
    """The listening sockets on `port` once there are any (30 s at most, or
    until `proc` ends)."""
    seen = []
    deadline = time.time() + 30
    while time.time() < deadline and not seen and proc.poll() is None:
        seen = listeners(port)
        time.sleep(0.05)
    return seen


port = free_port()
run = os.path.join(tmp, "run")
r0 = subprocess.Popen([snip, "train", "--config", cfg, "--run-dir", run], env=env_for(0, port),
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
r1 = None
try:
    # Rank 0 hosts the store and waits in the handshake for rank 1.
    seen = wait_listening(port, r0)
    c.check(seen == [("/proc/net/tcp", "0100007F")],
            "the store listens on 127.0.0.1 only (MASTER_ADDR), not on every address",
            f"listening sockets on port {port}: {seen}")
    r1 = subprocess.Popen([snip, "train", "--config", cfg, "--run-dir", run], env=env_for(1, port),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    o0, e0 = r0.communicate(timeout=120)
    o1, e1 = r1.communicate(timeout=120)
    c.check(r0.returncode == 0 and r1.returncode == 0, "both ranks train to the end",
            f"rc {r0.returncode} {r1.returncode}: {e0[-800:]} {e1[-800:]}")
finally:
    for p in (r0, r1):
        if p is not None and p.poll() is None:
            os.killpg(p.pid, 9)
            p.communicate()

# An address of another machine (TEST-NET-1, RFC 5737): rank 0 cannot bind
# it, so its store listens on every address (and rank 0 waits for ranks
# that never come: it is stopped once the socket is seen).
port = free_port()
p = subprocess.Popen([snip, "train", "--config", cfg, "--run-dir", os.path.join(tmp, "nat")],
                     env=env_for(0, port, "192.0.2.1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                     start_new_session=True)
try:
    seen = wait_listening(port, p)
    wildcard = [s for s in seen if set(s[1]) == {"0"}]
    c.check(len(wildcard) == 1 and len(seen) == 1, "a MASTER_ADDR not of this machine: the store on every address",
            f"listening sockets on port {port}: {seen}")
finally:
    if p.poll() is None:
        os.killpg(p.pid, 9)
    _, err = p.communicate()
warned = [l for l in err.splitlines() if "192.0.2.1" in l and "not an address of rank 0's machine" in l]
c.check(len(warned) == 1, "... and one warning line naming it", err[-600:])
shutil.rmtree(tmp, ignore_errors=True)
c.finish()
