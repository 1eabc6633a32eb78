#!/usr/bin/python3
"""Checks that no non-test source file or function outgrows what a reader holds.

usage: code_size_test.py [SOURCE_ROOT]      check the tree (prints offenders)
       code_size_test.py --list [ROOT]      print every function over the limit
       code_size_test.py --self-test        check the checker

Limits (docs/design.md §7, "Size"): a source file (C++ .h/.cc, Python, shell,
JavaScript) has at most MAX_FILE_LINES lines and a C++ function at most
MAX_FUNCTION_LINES, counted from the first line of its signature (so a
constructor's initializer list counts) to the line of its closing brace. tests/, generated files and vendored files are not counted.
A long function is split along its seams, never squeezed onto fewer lines.

The C++ reader is deliberately small: it strips comments, string and character
literals (raw strings included), then matches braces. A brace opens a function
body when, at namespace or class scope, the text since the previous `;`, `{` or
`}` holds a parameter list and does not start a namespace, class, struct,
union or enum, nor an initializer (`= {`). Lambdas and local classes count
toward their enclosing function.
Exit status 0 = pass, 1 = fail (each offender on its own line).
"""
import os
import re
import subprocess
import sys
import tempfile

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100
SOURCE_EXTS = (".h", ".cc", ".py", ".sh", ".mjs", ".js")
CXX_EXTS = (".h", ".cc")
# Folders whose files are not the project's own prose of code.
EXCLUDED_PREFIXES = ("tests/", "build", "testdata/", "third_party/", ".")
SCOPE_KEYWORDS = re.compile(r"^\s*(template\s*<.*>\s*)?(namespace|class|struct|union|enum|extern\s+\"C\")\b")


def strip_cxx(text):
    """Text with comments and literals blanked, newlines kept."""
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
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            k = text.find("(", i + 2)
            delim = text[i + 2:k]
            end = text.find(")" + delim + '"', k)
            end = n if end < 0 or k < 0 else end + len(delim) + 2
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == "#" and (i == 0 or text.rfind("\n", 0, i) == i - 1 - len(text[text.rfind("\n", 0, i) + 1:i]) and
                                 not text[text.rfind("\n", 0, i) + 1:i].strip()):
            j = i  # a preprocessor line, with its continuations
            while True:
                j = text.find("\n", j)
                if j < 0 or text[j - 1] != "\\":
                    break
                j += 1
            j = n if j < 0 else j
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first_line, n_lines) of each function body in C++ source text."""
    code = strip_cxx(text)
    found = []
    # Stack of (kind, start_line, header) where kind is 'scope', 'function' or 'other'.
    stack = []
    header_start = 0
    line = 1
    parens = 0
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "(":
            parens += 1
        elif c == ")":
            parens = max(0, parens - 1)
        elif c == "{":
            header = code[header_start:i]
            inside_function = any(kind == "function" for kind, _, _ in stack)
            if parens > 0 or (not inside_function and re.search(r"\)\s*[:,][^;{}]*[\w>]\s*$", header)):
                stack.append(("inline", line, header))  # braces in arguments or a member initializer
                continue
            if inside_function:
                kind = "other"
            elif SCOPE_KEYWORDS.search(header.lstrip()):
                kind = "scope"
            elif "(" in header and not re.search(r"=\s*$", header) and not re.search(r"\)\s*=", header):
                kind = "function"
            else:
                kind = "scope" if not stack or stack[-1][0] == "scope" else "other"
            first = header_start + len(header) - len(header.lstrip())
            stack.append((kind, code.count("\n", 0, first) + 1 if kind == "function" else line, header))
            header_start = i + 1
        elif c == "}":
            if stack:
                kind, start, header = stack.pop()
                if kind == "inline":
                    continue
                if kind == "function":
                    name = re.findall(r"([~\w:]+(?:<[^()]*>)?)\s*\(", header)
                    found.append((name[0] if name else "?", start, line - start + 1))
            header_start = i + 1
        elif c == ";" and parens == 0:
            header_start = i + 1
    return found


def source_files(root):
    listed = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True)
    if listed.returncode == 0:
        paths = listed.stdout.split()
    else:  # not a git checkout: walk
        paths = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]
    for rel in sorted(set(paths)):
        if not rel.endswith(SOURCE_EXTS) or rel.startswith(EXCLUDED_PREFIXES) or "/tests/" in rel:
            continue
        if rel.endswith((".pb.h", ".pb.cc")) or "/generated/" in rel:
            continue
        path = os.path.join(root, rel)
        if os.path.isfile(path):
            yield rel, path


def offenders(root):
    problems = []
    for rel, path in source_files(root):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        n = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if n > MAX_FILE_LINES:
            problems.append(f"{rel}: {n} lines (limit {MAX_FILE_LINES})")
        if rel.endswith(CXX_EXTS):
            for name, start, length in functions(text):
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{rel}:{start}: function {name} is {length} lines (limit {MAX_FUNCTION_LINES})")
    return problems


def self_test():
    body = "\n".join(f"  x += {i};" for i in range(120))
    short = "int Short() {\n  return 1;\n}\n"
    text = ("namespace a {\nstruct S {\n  int Member() const {\n" + body + "\n    return x;\n  }\n};\n"
            "const char* k = R\"(} { )\";\nint v[] = {1, 2};\n" + short +
            "void Long(int y) {\n  auto f = [&] { return y; };\n  if (y) {\n" + body + "\n  }\n}\n}  // namespace a\n")
    got = {name: length for name, _, length in functions(text)}
    failures = []
    if got.get("Member", 0) <= MAX_FUNCTION_LINES:
        failures.append(f"member function not measured: {got}")
    if got.get("Short") != 3:  # signature line to closing brace
        failures.append(f"Short measured as {got.get('Short')}, want 3")
    if got.get("Long", 0) <= MAX_FUNCTION_LINES or "f" in got:
        failures.append(f"Long or its lambda mis-measured: {got}")
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "shared/x"))
        os.makedirs(os.path.join(root, "tests/x"))
        with open(os.path.join(root, "shared/x/big.cc"), "w") as f:
            f.write(text + "\n" * 900)
        with open(os.path.join(root, "tests/x/big_test.cc"), "w") as f:
            f.write(text + "\n" * 900)
        found = offenders(root)
        if not any("shared/x/big.cc:" in p and "lines (limit" in p and "function" not in p for p in found):
            failures.append(f"long file not reported: {found}")
        if not any("function Long" in p for p in found):
            failures.append(f"long function not reported: {found}")
        if any(p.startswith("tests/") for p in found):
            failures.append(f"tests/ reported: {found}")
    for f in failures:
        print("self-test:", f)
    return 1 if failures else 0


def main(argv):
    if argv[1:2] == ["--self-test"]:
        return self_test()
    args = [a for a in argv[1:] if a != "--list"]
    root = args[0] if args else os.getcwd()
    problems = offenders(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} over the limits: split along the seams (docs/design.md §7)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
