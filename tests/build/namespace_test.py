#!/usr/bin/python3
"""Checks that every namespace equals its folder, and that no source cites a tracker issue.

usage: namespace_test.py [SOURCE_ROOT]   check the tree
       namespace_test.py --self-test     check the checker

1. Namespaces (the rule of docs/design.md §7 "Namespaces"): a folder's
   namespace is `lede::` followed by its path, `/` read as `::`, with the
   floor folders `shared/` and `services/` left out:
     shared/speculation -> lede::speculation, policy/dqn -> lede::policy::dqn,
     shared/model/internal -> lede::model::internal, trainer -> lede::trainer.
   A service whose name is also a library's (services/model, services/policy)
   adds `_service`: lede::model_service, lede::policy_service. One exception:
   shared/status declares the status vocabulary (Status, StatusOr, ...) in
   `lede` itself, as absl::Status is absl's.
   Every `namespace lede...{` a .h/.cc file opens must be its folder's
   namespace or one nested in it (`internal`, a named part such as
   lede::model::cpu), where the nested name is not a subfolder (a file of
   policy/ may not open lede::policy::dqn: that is policy/dqn's; `internal`
   is allowed beside an internal/ folder, for the .cc that implements it). Blocks that
   only forward-declare another folder's classes are allowed. Tests under
   tests/<path> follow <path> when that source folder exists; test-only
   folders (tests/testing, tests/services/e2e, ...) are not checked.
2. Reasons, not tracker numbers: no source or test file (C++, CMake,
   scripts, Python, proto, deploy files, tests and test data with their
   notes; not docs/, which tests/docs/docs_test.py checks, nor the models'
   files) contains "issue N" - the tracker is not part of the repository, so
   the comment says the reason itself or points to docs/design.md §n. The
   two checkers' own fixtures are exempt.
Exit status 0 = pass, 1 = fail (each violation on its own line).
"""
import os
import re
import sys
import tempfile

FLOORS = ("shared", "services")  # left out of the namespace
SOURCE_TOPS = ("shared", "policy", "trainer", "services", "bench")
TOP_LIBRARIES = ("policy", "trainer", "bench")  # top-level folders that are libraries
EXCEPTIONS = {"shared/status": "lede"}
CXX_EXTS = (".h", ".cc")
NS_OPEN_RE = re.compile(r"^[ \t]*namespace[ \t]+(lede(?:::\w+)*)[ \t]*\{", re.M)
FWD_DECL_RE = re.compile(r"(class|struct)\s+\w+\s*;")
ISSUE_RE = re.compile(r"\bissues?\s+#?\d+", re.I)
# ... and wrapped: "issue" ending a line, its number opening the next line after a comment leader.
WRAPPED_ISSUE_RE = re.compile(r"\b(issues?)\s*$", re.I)
WRAPPED_NUMBER_RE = re.compile(r"^\s*(?:#+|//+|\*|--)?\s*(#?\d+)")
# Not source: tests, prose, data, generated or recorded results.
NON_SOURCE_TOPS = ("tests", "docs", "testdata", "models")
NON_SOURCE_EXTS = (".md", ".json", ".jsonl", ".txt", ".csv", ".svg", ".png", ".bin", ".gguf",
                   ".safetensors", ".model")
# Where "issue N" is looked for: all but prose checked elsewhere, the models'
# files and recorded results; data files (not comments) are skipped.
ISSUE_SKIPPED_TOPS = ("docs", "models")
DATA_EXTS = (".json", ".jsonl", ".csv", ".svg", ".png", ".bin", ".gguf", ".safetensors", ".model")
# The checkers of this rule, whose fixtures cite issues on purpose.
ISSUE_CHECKERS = ("tests/build/namespace_test.py", "tests/docs/docs_test.py")


def library_names(root):
    shared = os.path.join(root, "shared")
    names = set(TOP_LIBRARIES)
    if os.path.isdir(shared):
        names |= {d for d in os.listdir(shared) if os.path.isdir(os.path.join(shared, d))}
    return names


def expected_namespace(folder, libraries):
    """The namespace of a source folder (root-relative, '/'-separated)."""
    if folder in EXCEPTIONS:
        return EXCEPTIONS[folder]
    parts = folder.split("/")
    if parts[0] == "services" and len(parts) > 1:
        name = parts[1] + ("_service" if parts[1] in libraries else "")
        parts = [name] + parts[2:]
    elif parts[0] in FLOORS:
        parts = parts[1:]
    return "::".join(["lede"] + parts)


def walk(root, top):
    base = os.path.join(root, top)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "node_modules"
                             and d != "__pycache__")
        for fn in sorted(filenames):
            yield os.path.relpath(os.path.join(dirpath, fn), root)


def forward_only(text, start):
    """Whether the namespace block opening at `start` holds only forward
    declarations (and comments)."""
    body = text[text.index("{", start) + 1:]
    end = body.find("\n}")
    if end < 0:
        return False
    lines = [l.split("//")[0].strip() for l in body[:end].split("\n")]
    lines = [l for l in lines if l]
    return bool(lines) and all(FWD_DECL_RE.fullmatch(l) for l in lines)


def check_namespaces(root):
    errors = []
    libraries = library_names(root)
    files = []
    for top in SOURCE_TOPS:
        files += [f for f in walk(root, top) if f.endswith(CXX_EXTS)]
    files += [f for f in walk(root, "tests") if f.endswith(CXX_EXTS)]
    for rel in files:
        folder = os.path.dirname(rel)
        source_folder = folder[len("tests/"):] if folder.startswith("tests/") else folder
        if folder.startswith("tests/") and not (source_folder.split("/")[0] in SOURCE_TOPS
                                                 and os.path.isdir(os.path.join(root, source_folder))):
            continue  # a test-only folder
        want = expected_namespace(source_folder, libraries)
        with open(os.path.join(root, rel), errors="replace") as f:
            text = f.read()
        for m in NS_OPEN_RE.finditer(text):
            ns = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            if ns == want:
                continue
            if ns.startswith(want + "::"):
                nested = ns[len(want) + 2:].split("::")[0]
                if nested == "internal" or not os.path.isdir(os.path.join(root, source_folder, nested)):
                    continue
                if forward_only(text, m.start()):
                    continue
                errors.append("%s:%d: namespace %s belongs to %s/%s/, not %s/ (whose namespace is %s; "
                              "docs/design.md §7)" % (rel, line, ns, source_folder, nested, source_folder, want))
                continue
            if forward_only(text, m.start()):
                continue
            errors.append("%s:%d: namespace %s, but %s/ is %s (docs/design.md §7)"
                          % (rel, line, ns, source_folder, want))
    return errors


def is_text_source(rel):
    top = rel.split("/")[0]
    if top in NON_SOURCE_TOPS or rel.startswith("bench/results/"):
        return False
    return os.path.basename(rel) == "CMakeLists.txt" or not rel.endswith(NON_SOURCE_EXTS)


def cites_no_issue(rel):
    """Whether rel falls under rule 2: source, tests and test data alike."""
    if rel.split("/")[0] in ISSUE_SKIPPED_TOPS or rel.startswith("bench/results/") or rel in ISSUE_CHECKERS:
        return False
    return not rel.endswith(DATA_EXTS) and (rel.split("/")[0] in ("tests", "testdata") or is_text_source(rel))


def check_issue_refs(root):
    errors = []
    for top in sorted(os.listdir(root)):
        if top.startswith(".") or top.startswith("build") or top in ISSUE_SKIPPED_TOPS:
            continue
        paths = [top] if os.path.isfile(os.path.join(root, top)) else walk(root, top)
        for rel in paths:
            if not cites_no_issue(rel):
                continue
            try:
                with open(os.path.join(root, rel), encoding="utf-8") as f:
                    lines = f.read().split("\n")
            except (UnicodeDecodeError, OSError):
                continue  # binary
            for i, line in enumerate(lines, 1):
                cited = issue_cited(line, lines[i] if i < len(lines) else "")
                if cited:
                    errors.append('%s:%d: cites "%s" of a tracker outside the repository; state the reason '
                                  "or point to docs/design.md §n" % (rel, i, cited))
    return errors


def issue_cited(line, next_line):
    """The "issue N" that `line` cites, on it or wrapped onto `next_line`; None if none."""
    m = ISSUE_RE.search(line)
    if m:
        return m.group(0)
    word, number = WRAPPED_ISSUE_RE.search(line), WRAPPED_NUMBER_RE.match(next_line)
    return "%s %s" % (word.group(1), number.group(1)) if word and number else None


def check(root):
    return check_namespaces(root) + check_issue_refs(root)


def self_test():
    """Each kind of violation is found in a tiny synthetic tree, and the tree
    passes once they are fixed."""
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        write("shared/status/status.h", "namespace lede {\nusing absl::Status;\n}  // namespace lede\n")
        write("shared/speculation/exit_controller.h",
              "namespace lede::speculation {\nstruct ExitState {};\n}  // namespace lede::speculation\n")
        write("shared/model/llama.h",
              "namespace lede::telemetry {\nstruct SpecDecodeMetrics;\n}\n"
              "namespace lede::model {\nnamespace internal {\n}\n}  // namespace lede::model\n"
              "namespace lede::model::cpu {\n}  // namespace lede::model::cpu\n")
        write("shared/model/internal/rounds.h", "namespace lede::model::internal {\n}\n")
        write("shared/model/rounds.cc", "namespace lede::model::internal {\nint x;\n}\n")
        write("policy/controllers.h", "namespace lede::policy {\n}\n")
        write("policy/dqn/dqn.h", "namespace lede::policy::dqn {\n}\n")
        write("services/model/model_host.h", "namespace lede::model_service {\n}\n")
        write("services/coordinator/coordinator.h", "namespace lede::coordinator {\n}\n")
        write("tests/shared/model/llama_test.cc", "namespace lede::model::testing {\n}\n")
        write("tests/services/e2e/e2e_test.cc", "namespace lede {\n}\n")
        write("scripts/run", "# restarts a crashed process (docs/design.md §3)\n")
        write("tests/policy/policy_test.cc", "// the reason\nnamespace lede::policy {\n}\n")
        write("docs/history.md", "fixed in issue 12\n")
        write("tests/build/namespace_test.py", "write('x', '# see issue 12')\n")
        assert check(root) == [], check(root)

        def expect(substring):
            errs = check(root)
            assert any(substring in e for e in errs), (substring, errs)

        # A type whose namespace names another folder.
        write("shared/speculation/exit_controller.h", "namespace lede::model {\nstruct ExitState {};\n}\n")
        expect("shared/speculation/exit_controller.h:1: namespace lede::model, but shared/speculation/ "
               "is lede::speculation")
        write("shared/speculation/exit_controller.h", "namespace lede::speculation {\n}\n")
        # A sub-folder's namespace opened in its parent.
        write("policy/controllers.h", "namespace lede::policy::dqn {\nint x;\n}\n")
        expect("namespace lede::policy::dqn belongs to policy/dqn/")
        write("policy/controllers.h", "namespace lede::policy {\n}\n")
        # An internal/ file outside ::internal.
        write("shared/model/internal/rounds.h", "namespace lede::model {\nint x;\n}\n")
        expect("namespace lede::model, but shared/model/internal/ is lede::model::internal")
        write("shared/model/internal/rounds.h", "namespace lede::model::internal {\n}\n")
        # A service that takes a library's name.
        write("services/model/model_host.h", "namespace lede::model {\n}\n")
        expect("but services/model/ is lede::model_service")
        write("services/model/model_host.h", "namespace lede::model_service {\n}\n")
        # The root namespace outside shared/status, and a test that mirrors a folder.
        write("tests/shared/model/llama_test.cc", "namespace lede {\n}\n")
        expect("tests/shared/model/llama_test.cc:1: namespace lede, but shared/model/ is lede::model")
        write("tests/shared/model/llama_test.cc", "namespace lede::model::testing {\n}\n")
        # A tracker number in a script, in CMake and in C++.
        write("scripts/run", "# see issue 17\n")
        write("shared/model/CMakeLists.txt", "# kernels (Issues #3)\n")
        write("shared/model/llama.cc", "// issue 5: RoPE\n")
        # ... wrapped onto the next comment line.
        write("services/coordinator/coordinator.cc", "  // within a second (issue\n  // 17, failure 4)\n")
        write("tests/bench/CMakeLists.txt", "# greedy text (issue\n# 35). Skipped\n")
        expect('services/coordinator/coordinator.cc:1: cites "issue 17"')
        expect('tests/bench/CMakeLists.txt:1: cites "issue 35"')
        expect('scripts/run:1: cites "issue 17"')
        expect('shared/model/CMakeLists.txt:1: cites "Issues #3"')
        expect('shared/model/llama.cc:1: cites "issue 5"')
        # ... and in a test and the test data's notes.
        write("tests/policy/policy_test.cc", "// Issue 49: the lock\n")
        write("testdata/SOURCES.md", "| x.jsonl | held-out (issue 37) |\n")
        expect('tests/policy/policy_test.cc:1: cites "Issue 49"')
        expect('testdata/SOURCES.md:1: cites "issue 37"')
        for rel in ("scripts/run", "shared/model/CMakeLists.txt", "shared/model/llama.cc", "tests/policy/policy_test.cc",
                    "testdata/SOURCES.md", "services/coordinator/coordinator.cc", "tests/bench/CMakeLists.txt"):
            write(rel, "# the reason\n")
        assert check(root) == [], check(root)
    print("self-test: ok")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(__file__), "..", ".."))
    errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print("%d violation(s)" % len(errors))
        return 1
    print("namespaces equal their folders; no tracker issue cited in source")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
