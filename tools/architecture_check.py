#!/usr/bin/env python3
"""The house's size and layering rules (docs/architecture.md), checked.

    architecture_check.py [--root DIR] [--max-file-lines 500] [--max-function-lines 100]

Checks the library's files (include/, src/, python/src/, python/muon_cpp/,
tools/; C++, CUDA and Python):
  * no file over --max-file-lines lines;
  * no function over --max-function-lines lines, counted from the line that
    opens its body to the line that closes it (C++: a brace block opened at
    namespace or class level after a parameter list; lambdas and blocks inside
    a function belong to it. Python: a `def` to its last indented line);
  * the umbrella header include/muon/muon.h includes every public header
    (the forwarding headers of the old include/muon/dist/ path aside);
  * no core file (outside the distributed/ folders) includes a distributed/
    or dist/ path.
Prints one line per offence, naming the file, the line and the count, and
exits 1 when there is any; 0 and a summary line otherwise.
"""

import argparse
import os
import re
import sys

LIBRARY_DIRS = ("include", "src", "python/src", "python/muon_cpp", "tools")
CPP_EXTS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
PY_EXTS = (".py",)
DISTRIBUTED = re.compile(r"(^|/)(distributed|dist)/")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
SCOPE = re.compile(r"^(template\s*<.*>\s*)?(class|struct|union|enum|namespace|extern)\b[^(]*$", re.S)
CONTROL = re.compile(r"^(if|for|while|switch|catch|do|else|try)\b")


def library_files(root):
    for top in LIBRARY_DIRS:
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(CPP_EXTS + PY_EXTS):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, root).replace(os.sep, "/"), path


def strip_cpp(text):
    """The text with comments, string and character literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            k = text.find("(", i + 2)
            delim = ")" + text[i + 2:k] + '"'
            j = text.find(delim, k)
            j = n if j < 0 else j + len(delim)
            out.append('""' + "".join("\n" for ch in text[i:j] if ch == "\n"))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    # Preprocessor lines (with their continuations) are not code here.
    return re.sub(r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", lambda m: "\n" * m.group(0).count("\n"), code)


def cpp_functions(text):
    """(name, first line, lines) of each function body at namespace or class level."""
    code = strip_cpp(text)
    stack = []  # kinds of the open blocks: "scope" (namespace, class, extern) or "function"/"other"
    header_start = 0
    line = 1
    found = []
    opened = []  # (line, header) of the blocks on the stack
    for pos, ch in enumerate(code):
        if ch == "\n":
            line += 1
        elif ch == "{":
            header = code[header_start:pos]
            h = header.strip()
            if not all(k == "scope" for k in stack):
                kind = "inner"
            elif SCOPE.match(h):
                kind = "scope"
            elif "(" in h and not CONTROL.match(h):
                kind = "function"
            else:
                kind = "other"
            stack.append(kind)
            opened.append((line, header))
            header_start = pos + 1
        elif ch == "}":
            if stack:
                kind = stack.pop()
                start, header = opened.pop()
                if kind == "function" and all(k == "scope" for k in stack):
                    name = re.findall(r"([~\w:<>=!+\-*/\[\]]+)\s*\(", header)
                    found.append((name[0] if name else "?", start, line - start + 1))
            header_start = pos + 1
        elif ch == ";":
            header_start = pos + 1
    return found


def py_functions(text):
    """(name, first line, lines) of each def, nested ones too."""
    lines = text.split("\n")
    found = []
    for i, l in enumerate(lines):
        m = re.match(r"^(\s*)(async\s+)?def\s+(\w+)", l)
        if not m:
            continue
        indent = len(m.group(1))
        last = i
        for j in range(i + 1, len(lines)):
            s = lines[j]
            if not s.strip() or s.lstrip().startswith("#"):
                continue
            if len(s) - len(s.lstrip()) <= indent:
                break
            last = j
        found.append((m.group(3), i + 1, last - i + 1))
    return found


def check(root, max_file, max_function):
    offences = []
    files = list(library_files(root))
    for rel, path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        count = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if count > max_file:
            offences.append(f"{rel}: {count} lines (at most {max_file})")
        funcs = py_functions(text) if rel.endswith(PY_EXTS) else cpp_functions(text)
        for name, start, n in funcs:
            if n > max_function:
                offences.append(f"{rel}:{start}: function {name} is {n} lines (at most {max_function})")
        if rel.endswith(CPP_EXTS) and not DISTRIBUTED.search(rel) and not rel.startswith(("tools/", "python/")):
            for i, l in enumerate(text.split("\n"), 1):
                m = INCLUDE.match(l)
                if m and DISTRIBUTED.search(m.group(1)) and rel != "include/muon/muon.h":
                    offences.append(f"{rel}:{i}: the core includes the distributed layer ({m.group(1)})")
    umbrella = os.path.join(root, "include", "muon", "muon.h")
    if os.path.exists(umbrella):
        with open(umbrella, encoding="utf-8") as f:
            included = {m.group(1) for m in map(INCLUDE.match, f.read().split("\n")) if m}
        for rel, _ in files:
            if rel.startswith("include/muon/") and rel.endswith(CPP_EXTS) and not rel.startswith("include/muon/dist/"):
                header = rel[len("include/"):]
                if header != "muon/muon.h" and header not in included:
                    offences.append(f"include/muon/muon.h: does not include the public header {header}")
    else:
        offences.append("include/muon/muon.h: the umbrella header is missing")
    return offences, len(files)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    p.add_argument("--max-file-lines", type=int, default=500)
    p.add_argument("--max-function-lines", type=int, default=100)
    a = p.parse_args(argv)
    offences, n = check(os.path.abspath(a.root), a.max_file_lines, a.max_function_lines)
    for o in offences:
        print(o)
    if offences:
        print(f"architecture: {len(offences)} offence(s) in {n} files (docs/architecture.md)")
        return 1
    print(f"architecture: {n} files within the rules (files <= {a.max_file_lines} lines, "
          f"functions <= {a.max_function_lines}, umbrella complete, core free of distributed/)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
