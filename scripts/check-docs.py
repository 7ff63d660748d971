#!/usr/bin/env python3
"""Check the READMEs and the book (docs/src/): links, pages, examples.

For each link `[text](target)` or `![alt](target)` outside code, in
README.md, the published crates' READMEs and every page under docs/src/:
  - a relative path must name an existing file (relative to the page);
  - a `#anchor` must be the id of a heading of the page it points to, as
    mdBook generates it (lowercased; letters, digits, `-` and `_` kept, white
    space turned into `-`, anything else dropped; `-1`, `-2`, ... appended to
    repeats);
  - a book page may not link out of docs/src/ (mdBook copies only src/, so
    such a link would break in the built book).
Every page under docs/src/ must also be listed in SUMMARY.md, so that none
is left out of the book. Links with a scheme (https:, mailto:) are not
fetched.

The book's Rust examples are compiled as the tenure crate's doctests (with
lines starting `# ` hidden, as mdBook and rustdoc both hide them); the
READMEs', which GitHub and crates.io would show with such lines, must each
be one of them with its hidden lines left out.

Exits 1 naming every problem, with its file and line.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "docs" / "src"
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """(line number, line) outside fenced code, with inline code removed."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        yield number, re.sub(r"`[^`]*`", "``", line)


def heading_text(raw):
    """A heading's text as rendered: links as their text, no code or emphasis marks."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return text.replace("`", "").replace("*", "")


def anchor_of(text):
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(path):
    used = set()
    fence = None
    for line in path.read_text(encoding="utf-8").split("\n"):
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        match = HEADING.match(line)
        if not match:
            continue
        base = anchor_of(heading_text(match.group(2)))
        candidate, counter = base, 0
        while candidate in used:
            counter += 1
            candidate = f"{base}-{counter}"
        used.add(candidate)
    return used


def rust_blocks(text):
    """The ```rust code blocks of a page, each as its list of lines."""
    blocks, current = [], None
    for line in text.split("\n"):
        if current is None:
            if re.match(r"^```rust\b", line):
                current = []
        elif line.startswith("```"):
            blocks.append(current)
            current = None
        else:
            current.append(line.rstrip())
    return blocks


def shown(block):
    return [line for line in block if not (line == "#" or line.startswith("# "))]


def main():
    pages = sorted(SRC.rglob("*.md"))
    readmes = [ROOT / "README.md", ROOT / "crates/tenure/README.md", ROOT / "crates/tenure-cli/README.md"]
    files = readmes + pages
    errors = []
    cache = {}
    for page in files:
        where = page.relative_to(ROOT)
        for number, line in prose_lines(page.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                    continue
                path_part, _, anchor = target.partition("#")
                dest = (page.parent / path_part).resolve() if path_part else page
                if path_part:
                    if not dest.exists():
                        errors.append(f"{where}:{number}: {target}: no such file")
                        continue
                    if page.is_relative_to(SRC) and not dest.is_relative_to(SRC):
                        errors.append(f"{where}:{number}: {target}: leaves docs/src/ (the built book would not have it)")
                        continue
                if anchor:
                    if dest.suffix != ".md":
                        errors.append(f"{where}:{number}: {target}: an anchor into a file that is not a page")
                        continue
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        errors.append(f"{where}:{number}: {target}: no heading with the id #{anchor} in {dest.relative_to(ROOT)}")
    compiled = [shown(block) for page in pages for block in rust_blocks(page.read_text(encoding="utf-8"))]
    for readme in readmes:
        for block in rust_blocks(readme.read_text(encoding="utf-8")):
            if block not in compiled:
                errors.append(f"{readme.relative_to(ROOT)}: the Rust example starting {block[0].strip()!r} is not one of the book's (compiled) examples")
    summary = (SRC / "SUMMARY.md").read_text(encoding="utf-8")
    listed = {(SRC / t).resolve() for t in LINK.findall(summary)}
    for page in pages:
        if page.name != "SUMMARY.md" and page.resolve() not in listed:
            errors.append(f"{page.relative_to(ROOT)}: not listed in docs/src/SUMMARY.md")
    for error in errors:
        print(error, file=sys.stderr)
    if errors:
        print(f"{len(errors)} problem(s) in the READMEs and docs/src/", file=sys.stderr)
        return 1
    print(f"docs: {len(files)} files checked: every relative link and anchor resolves, every page is in SUMMARY.md, the READMEs' examples are the book's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
