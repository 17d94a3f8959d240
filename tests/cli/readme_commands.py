#!/usr/bin/env python3
"""The README's command table and `snip ... --help` agree.

For every row of the table under "## The `snip` command" in README.md that starts
with `snip SUB [SUBSUB]`: each option the row names (--name) is an option
of that command's --help (nothing stale or misspelt), and each option the
command's --help lists is named in the README (in the row, or elsewhere in
the README where the command's options are explained). The help of
`snip plan show` and the row's wording of its default say the same.

usage: readme_commands.py SNIP_BINARY PREPARED_DATA_DIR
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks  # noqa: E402

snip = sys.argv[1]
T = Checks(snip)
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
readme = open(os.path.join(root, "README.md")).read()

# Options every subcommand takes (src/cli/run_app.h), documented once.
GLOBAL = {"--help", "--log-level", "--quiet", "--version"}


def help_options(words):
    """(exit status, the --long options of `snip WORDS --help`)."""
    p = subprocess.run([snip] + words + ["--help"], capture_output=True, text=True, timeout=60)
    opts = set()
    for line in p.stdout.splitlines():
        m = re.match(r"^\s+(?:-[A-Za-z],)?(--[a-z][a-z0-9-]*)", line)
        if m:
            opts.add(m.group(1))
    return p.returncode, opts


table = readme[readme.index("## The `snip` command"):]
table = table[:table.index("\n## ", 5)]
rows = [l for l in table.splitlines() if l.startswith("| `snip ")]
T.check(len(rows) >= 10, "the README's command table has its rows", str(len(rows)))
commands = {}
for row in rows:
    synopsis = re.split(r"(?<!\\)\|", row)[1]
    for m in re.finditer(r"`snip ([a-z]+)(?: ([a-z]+))?[^`]*`", synopsis):
        words = [m.group(1)] + ([m.group(2)] if m.group(2) and m.group(2) not in ("RUN",) else [])
        key = tuple(words)
        commands.setdefault(key, set()).update(re.findall(r"--[a-z][a-z0-9-]*", m.group(0)))
for key, named in sorted(commands.items()):
    words = list(key)
    rc, opts = help_options(words)
    if rc != 0 and len(words) == 2:  # `snip data encode|decode`: the table's second word is not a subcommand
        words = words[:1]
        rc, opts = help_options(words)
    T.check(rc == 0 and opts, f"snip {' '.join(words)} --help", f"rc={rc}")
    for o in sorted(named - opts - GLOBAL):
        T.check(False, f"README names {o} for snip {' '.join(words)}, which --help does not list")
    for o in sorted(opts - GLOBAL):
        T.check(o in named, f"snip {' '.join(words)} {o} (in --help) is named in its README row")

# `snip plan show`'s default, in the README row and in --help.
p = subprocess.run([snip, "plan", "show", "--help"], capture_output=True, text=True, timeout=60)
T.check("newest plan of the plan phase" in p.stdout, "plan show --help says the default is the newest plan-phase plan",
        p.stdout[-400:])
T.check("newest plan of the plan phase" in readme, "the README says the same")
T.finish()
