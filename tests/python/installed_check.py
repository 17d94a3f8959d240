"""The snip package `pip install .` put into the venv (scripts/setup.sh) is
this tree's: it imports from site-packages (not python/), has the tree's
version, its Python files are the tree's byte for byte, and its operators
load and run. Exit 0, or 1 naming what differs (run scripts/setup.sh).

usage: installed_check.py TREE_PACKAGE_DIR VERSION
"""
import pathlib
import sys

tree, version = pathlib.Path(sys.argv[1]), sys.argv[2]
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != tree.parent.resolve()]
import snip  # noqa: E402
import torch  # noqa: E402

installed = pathlib.Path(snip.__file__).parent
problems = []
if "site-packages" not in str(installed):
    problems.append(f"snip imports from {installed}, not from site-packages")
if snip.__version__ != version:
    problems.append(f"version {snip.__version__}, the tree's is {version}")
for f in sorted(tree.glob("*.py")):
    other = installed / f.name
    if not other.is_file() or other.read_bytes() != f.read_bytes():
        problems.append(f"{other} differs from {f}")
if not torch.equal(snip.fake_quant(torch.full((1, 32), 6.0), "mxfp4"), torch.full((1, 32), 6.0)):
    problems.append("the installed operators do not run")
if problems:
    print("python_installed: " + "; ".join(problems) + " (run scripts/setup.sh)")
    sys.exit(1)
print(f"snip {snip.__version__} installed at {installed}: the tree's files")
