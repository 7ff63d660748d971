#!/usr/bin/env python3
"""List Rust files over 600 lines and functions over 80 lines (issue 24).

Usage: scripts/long-items.py PATH... [--file-lines N] [--fn-lines N]

Each PATH is a `.rs` file or a directory searched for them. A function
runs from its `fn` line to the first line that is its closing brace at
the same indentation; a declaration without a body (`fn f();`) and a
one-line function are not counted. Exits 1 if anything is too long.
"""

import argparse
import os
import re
import sys

FN = re.compile(
    r"^(?P<indent>\s*)(?:pub(?:\([^)]*\))?\s+)?(?:default\s+)?(?:const\s+)?"
    r"(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+(?P<name>\w+)"
)


def rust_files(paths):
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d != "target")
                for name in sorted(files):
                    if name.endswith(".rs"):
                        yield os.path.join(root, name)
        elif path.endswith(".rs") and os.path.isfile(path):
            yield path
        else:
            print(f"{path}: not a .rs file or a directory", file=sys.stderr)


def long_functions(lines, limit):
    """(line number, name, length) of every function longer than `limit`."""
    found = []
    for start, line in enumerate(lines):
        match = FN.match(line)
        if not match or line.lstrip().startswith("//"):
            continue
        indent = match.group("indent")
        # A declaration ends with `;` before its body would open.
        head = start
        while head < len(lines) and "{" not in lines[head]:
            if lines[head].rstrip().endswith(";"):
                break
            head += 1
        if head >= len(lines) or "{" not in lines[head]:
            continue
        closing = indent + "}"
        end = None
        for number in range(start, len(lines)):
            text = lines[number].rstrip()
            if text == closing or (number == start and text.endswith("}")):
                end = number
                break
        if end is None:
            continue
        length = end - start + 1
        if length > limit:
            found.append((start + 1, match.group("name"), length))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--file-lines", type=int, default=600)
    parser.add_argument("--fn-lines", type=int, default=80)
    args = parser.parse_args()
    long = 0
    for path in rust_files(args.paths):
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
        if len(lines) > args.file_lines:
            print(f"{path}: {len(lines)} lines (over {args.file_lines})")
            long += 1
        for number, name, length in long_functions(lines, args.fn_lines):
            print(f"{path}:{number}: fn {name}: {length} lines (over {args.fn_lines})")
            long += 1
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())
