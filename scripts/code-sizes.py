#!/usr/bin/env python3
"""Fails when a function is over 100 lines or a source file over 800 (issue #20).

What is measured:
- Rust: every `.rs` file under crates/*/ (src/, examples/ and build.rs: code that ships or that
  people run and read) except tests/, benches/ and fuzz/ folders, which are test harnesses.
  A function runs from the line of its `fn` to the line of its closing brace (doc comments and
  attributes not counted); it is found by the `fn` keyword and brace matching over text whose
  comments, strings and character literals are blanked out. `#[cfg(test)]` items are skipped,
  inline (`#[cfg(test)] mod tests { ... }`) or as files (`#[cfg(test)] mod tests;`), and so are
  their lines when a file is measured.
- Python: every `.py` file under python/ and scripts/ except python/tests/; a function (or
  method) runs from its `def` to its last line, as Python's own parser reports them.
- Files: lines outside test code, at most 800.
The aims are 80 and 600 lines; `--aim` lists what is over them (still exiting 1 on the limits only).
Written by hand because no maintained cargo tool checks function length across a workspace
(clippy's `too_many_lines` counts only code lines, and is per crate and opt-in).
Usage: scripts/code-sizes.py [--aim] [ROOT]
Exits 1 when anything is over its limit, listing each as `path:line: what`.
"""

import ast
import os
import re
import sys

FN_LIMIT, FILE_LIMIT = 100, 800
FN_AIM, FILE_AIM = 80, 600
SKIP_DIRS = {"tests", "benches", "fuzz", "target", "__pycache__", ".git"}


def blank_rust(text):
    """The text with comments, strings and char literals replaced by spaces (newlines kept), so
    that braces and `fn` found in it are code."""
    out, i, n = [], 0, len(text)

    def blank(s):
        return re.sub(r"[^\n]", " ", s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif m := re.compile(r'b?r(#*)"').match(text, i):
            if i and (text[i - 1].isalnum() or text[i - 1] == "_"):
                out.append(c)
                i += 1
                continue
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '{', '\n', '\u{7f}'), or a lifetime ('a), which has no
            # closing quote right after its first character.
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 3)
                j = n if j < 0 else j + 1
            elif i + 2 < n and text[i + 2] == "'":
                j = i + 3
            else:
                j = i + 1
            out.append(blank(text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


CFG_TEST = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*")
ITEM_OPEN = re.compile(r"[^;{]*")
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")
MOD_FILE = re.compile(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;")


def test_spans(code):
    """(start, end) offsets of `#[cfg(test)]` items, and names of `#[cfg(test)] mod x;` files."""
    spans, files = [], []
    for m in CFG_TEST.finditer(code):
        item = ITEM_OPEN.match(code, m.end())
        end = item.end()
        if end < len(code) and code[end] == "{":
            spans.append((m.start(), matching_brace(code, end)))
        else:
            spans.append((m.start(), end))
            if f := MOD_FILE.match(code, m.end()):
                files.append(f.group(1))
    return spans, files


def rust_functions(code, spans):
    """(name, first line, line count) of each function with a body outside test spans."""
    line_at = [0] * (len(code) + 1)
    line = 1
    for i, c in enumerate(code):
        line_at[i] = line
        if c == "\n":
            line += 1
    line_at[len(code)] = line
    for m in FN.finditer(code):
        if any(a <= m.start() <= b for a, b in spans):
            continue
        # The body opens at the first `{` outside parentheses and brackets; a `;` there
        # first means a declaration without one (a trait method).
        depth, j = 0, m.end()
        while j < len(code):
            c = code[j]
            if c in "([":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif depth == 0 and c in "{;":
                break
            j += 1
        if j >= len(code) or code[j] == ";":
            continue
        end = matching_brace(code, j)
        yield m.group(1), line_at[m.start()], line_at[end] - line_at[m.start()] + 1


def module_dir(path):
    base = os.path.basename(path)
    if base in ("mod.rs", "lib.rs", "main.rs", "build.rs") or os.sep + "examples" + os.sep in path:
        return os.path.dirname(path)
    return path[:-3]


def rust_files(root):
    for crate in sorted(os.listdir(os.path.join(root, "crates"))):
        top = os.path.join(root, "crates", crate)
        for dirpath, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(dirpath, f)


def check_rust(root, fn_max, file_max, report):
    skipped = set()
    for path in rust_files(root):
        if path in skipped:
            continue
        with open(path, encoding="utf-8") as f:
            code = blank_rust(f.read())
        spans, test_files = test_spans(code)
        for name in test_files:
            d = module_dir(path)
            skipped.add(os.path.join(d, name + ".rs"))
            skipped.add(os.path.join(d, name, "mod.rs"))
            for dirpath, _, files in os.walk(os.path.join(d, name)):
                skipped.update(os.path.join(dirpath, f) for f in files)
        test_lines = sum(code.count("\n", a, b) + 1 for a, b in spans)
        lines = code.count("\n") - test_lines
        if lines > file_max:
            report(path, 1, f"the file has {lines} lines outside tests, over {file_max}")
        for name, line, count in rust_functions(code, spans):
            if count > fn_max:
                report(path, line, f"fn {name} is {count} lines, over {fn_max}")


def python_files(root):
    for top in ("python", "scripts"):
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for f in sorted(files):
                if f.endswith(".py"):
                    yield os.path.join(dirpath, f)


def check_python(root, fn_max, file_max, report):
    for path in python_files(root):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines = text.count("\n")
        if lines > file_max:
            report(path, 1, f"the file has {lines} lines, over {file_max}")
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = node.end_lineno - node.lineno + 1
                if count > fn_max:
                    report(path, node.lineno, f"def {node.name} is {count} lines, over {fn_max}")


def main():
    args = sys.argv[1:]
    aim = "--aim" in args
    args = [a for a in args if a != "--aim"]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    root = os.path.normpath(root)
    over = []

    def report(path, line, what):
        over.append(f"{os.path.relpath(path, root)}:{line}: {what}")

    check_rust(root, FN_LIMIT, FILE_LIMIT, report)
    check_python(root, FN_LIMIT, FILE_LIMIT, report)
    for o in over:
        print(o)
    if over:
        print(f"{len(over)} over the limits; split them into named steps (see issue #20)")
    if aim:
        aims = []
        check_rust(root, FN_AIM, FILE_AIM, lambda p, ln, w: aims.append((p, ln, w)))
        check_python(root, FN_AIM, FILE_AIM, lambda p, ln, w: aims.append((p, ln, w)))
        for p, ln, w in aims:
            print(f"aim: {os.path.relpath(p, root)}:{ln}: {w}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
