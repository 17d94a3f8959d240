#!/usr/bin/env python3
"""The layering of snip's libraries, enforced: a folder of src/ and
include/snip/ may include headers of its own folder and of folders below it in
LAYERS, never of one above (upward includes would otherwise compile unnoticed
wherever two layers share one library). docs/architecture.md draws the same
order.

Every #include "snip/<folder>/..." of every .h and .cpp under src/ and
include/snip/ is checked; a folder that is not in LAYERS is an error too (a
new folder takes its place in the list, and in docs/architecture.md).

usage: check_layers.py [REPO_ROOT]     exit 0, or 1 listing each violation
"""
import os
import re
import sys

# Bottom to top. A folder may include itself and anything before it.
LAYERS = [
    "core",     # errors, statistics, FNV-1a, strings (header-only)
    "formats",  # element formats, scaling, the float64 golden reference
    "io",       # atomic files, JSON/TOML, safetensors
    "recipes",  # recipes: one QuantSpec per GEMM operand, the registry, recipe files
    "data",     # corpora, tokenizer, shards, the data loader
    "config",   # the run's options
    "hw",       # the machine: CPU, memory, BF16 GEMM backends
    "plan",     # the planner: ILP, heuristics, pins, cost tables, plan files
    "run",      # a run's files without LibTorch: checkpoint folders, manifests
    "report",   # report.html
    "monitor",  # /metrics, the quantization-error streak
    "model",    # Llama, QuantLinear, quantizers bound to tensors, LoRA, Hugging Face I/O
    "dist",     # the world, c10d, DDP buckets, ZeRO, pipeline stages
    "method",   # the stats step, the precision controller
    "train",    # the step, the loop, checkpoints, the guard
    "app",      # what the commands do: study, experiment, planning, doctor
    "cli",      # the snip and snip-data programs
    "python",   # the Python package's custom operators (TORCH_LIBRARY(snip))
]

INCLUDE = re.compile(r'^\s*#\s*include\s+"snip/([a-z_]+)/([^"]+)"', re.M)


def violations(root):
    rank = {name: i for i, name in enumerate(LAYERS)}
    out = []
    for base in ("src", os.path.join("include", "snip")):
        top = os.path.join(root, base)
        for folder in sorted(os.listdir(top)):
            path = os.path.join(top, folder)
            if not os.path.isdir(path):
                continue
            if folder not in rank:
                out.append(f"{base}/{folder}: not a layer of tests/layering/check_layers.py (place it in LAYERS)")
                continue
            for dirpath, _, files in os.walk(path):
                for name in sorted(files):
                    if not name.endswith((".h", ".cpp", ".hpp", ".cu", ".cuh")):
                        continue
                    f = os.path.join(dirpath, name)
                    text = open(f, encoding="utf-8").read()
                    for m in INCLUDE.finditer(text):
                        target = m.group(1)
                        line = text.count("\n", 0, m.start()) + 1
                        rel = os.path.relpath(f, root)
                        if target not in rank:
                            out.append(f"{rel}:{line}: includes snip/{target}/{m.group(2)}, not a layer")
                        elif rank[target] > rank[folder]:
                            out.append(f"{rel}:{line}: includes snip/{target}/{m.group(2)}: {target} is above "
                                       f"{folder}")
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    bad = violations(root)
    for v in bad:
        print(v)
    print(f"layering: {len(bad)} violation(s) over {len(LAYERS)} layers")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
