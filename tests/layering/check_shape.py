#!/usr/bin/env python3
"""The shape of the trainer, enforced: the loop stays readable on one screen
and its parts stay small (docs/architecture.md "One training step").

  - src/train/trainer.cpp (the loop) is under MAX_TRAINER_LINES lines;
  - no function defined in src/train/*.cpp is longer than MAX_FUNCTION_LINES
    lines, from the line its signature starts on to its closing brace.

A function is a definition that starts in column 0 (the project's style:
clang-format, two-space indent) and ends at the next "}" in column 0;
namespaces, classes and structs are not functions. Lambdas count as part of
the function around them.

usage: check_shape.py [REPO_ROOT]   exit 0, or 1 naming each file or function
"""
import os
import sys

MAX_TRAINER_LINES = 300
MAX_FUNCTION_LINES = 150
NOT_FUNCTIONS = ("namespace", "}", "//", "#", "struct", "class", "using", "template", "extern", "enum",
                 "static_assert", "constexpr", "union")


def functions(text):
    """(first line, length, signature) of every function defined in column 0."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace() and "(" in line and not line.startswith(NOT_FUNCTIONS):
            k = i  # the signature may span lines: find its "{" (a declaration ends with ";")
            while k < len(lines) and not lines[k].rstrip().endswith(("{", ";")):
                k += 1
            if k < len(lines) and lines[k].rstrip().endswith("{") and not lines[k].rstrip().endswith("= {"):
                j = k + 1
                while j < len(lines) and not lines[j].startswith("}"):
                    j += 1
                out.append((i + 1, j - i + 1, line.strip()))
                i = j
        i += 1
    return out


def problems(root):
    out = []
    train = os.path.join(root, "src", "train")
    n = open(os.path.join(train, "trainer.cpp")).read().count("\n")
    if n >= MAX_TRAINER_LINES:
        out.append(f"src/train/trainer.cpp: {n} lines, the limit is {MAX_TRAINER_LINES} (move a part into a "
                   "component of src/train/session.h)")
    for name in sorted(os.listdir(train)):
        if name.endswith(".cpp"):
            for first, length, sig in functions(open(os.path.join(train, name)).read()):
                if length > MAX_FUNCTION_LINES:
                    out.append(f"src/train/{name}:{first}: {sig[:70]} is {length} lines, the limit is "
                               f"{MAX_FUNCTION_LINES}")
    return out


def self_test():
    """The detector on a text whose functions are known."""
    text = "namespace a {\n\nint f(int x) {\n  return x;\n}\n\nvoid g(int a,\n       int b) {\n  h();\n}\n" \
           "struct S {\n  int x;\n};\nint decl(int);\n}  // namespace a\n"
    got = [(f, n) for f, n, _ in functions(text)]
    assert got == [(3, 3), (7, 4)], got


if __name__ == "__main__":
    self_test()
    found = problems(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    for p in found:
        print(p)
    if not found:
        print(f"check_shape: trainer.cpp under {MAX_TRAINER_LINES} lines, every function of src/train under "
              f"{MAX_FUNCTION_LINES}")
    sys.exit(1 if found else 0)
