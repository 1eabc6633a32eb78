#!/usr/bin/python3
"""Checks the includes of every project file against the declared build graph.

usage: include_graph_test.py TARGETS_FILE [SOURCE_ROOT]   check the tree
       include_graph_test.py --self-test                 check the checker

Every header sits under the one repository root, so include paths alone cannot
catch an undeclared dependency. This test can:
  1. each project header belongs to the library target of its folder (the
     target that lists it, else the folder's only library; generated
     proto/lede/v1/*.pb.h to lede_proto);
  2. a file that includes a header of another target must belong to a target
     that depends on it, directly or transitively (target_link_libraries);
  3. a folder includes only folders of a lower layer (LAYERS below, the order
     of docs/design.md §7: shared/* at the bottom, then policy, trainer,
     services, bench); no service folder includes another, and policy/ never
     includes proto/;
  4. the folder graph drawn from the includes has no cycle.
tests/ may include anything (its targets must still declare what they use).

TARGETS_FILE is written by the top CMakeLists.txt at configure time
(build/lede_targets.txt): one target per line, name|type|folder|sources|deps.
Exit status 0 = pass, 1 = fail (each violation on its own line).
"""
import os
import re
import sys
import tempfile

# The layer order, lowest first; a folder may include only folders of an
# earlier layer (and itself). Defined here once; docs/building.md "Layout" follows it.
LAYERS = [
    ["shared/status", "shared/log", "proto"],
    ["shared/clock", "shared/file", "shared/flags", "shared/telemetry", "shared/speculation"],
    ["shared/checkpoint"],  # (GGUF files carry tokenizers: shared/tokenizer reads them)
    ["shared/rpc", "shared/storage", "shared/tokenizer"],
    ["shared/experience", "shared/model"],
    ["policy"],
    ["policy/dqn"],
    ["trainer"],
    ["services/cli", "services/coordinator", "services/model", "services/policy"],
    ["bench"],
]
# (including folder prefix, included folder): never, whatever the layers say.
FORBIDDEN = [("policy", "proto")]
FREE = "tests"  # tests/ may include anything
LIBRARY_TYPES = {"STATIC_LIBRARY", "SHARED_LIBRARY", "OBJECT_LIBRARY", "INTERFACE_LIBRARY"}
SOURCE_EXTS = (".h", ".cc")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
GENERATED_PROTO_RE = re.compile(r"^proto/.*\.pb\.h$")


def rank_of():
    return {folder: i for i, layer in enumerate(LAYERS) for folder in layer}


def folder_of(rel, ranks):
    """The layered folder a root-relative path lies in (the longest match), or
    FREE for tests/, or None."""
    if rel == FREE or rel.startswith(FREE + "/"):
        return FREE
    best = None
    for folder in ranks:
        if rel.startswith(folder + "/") and (best is None or len(folder) > len(best)):
            best = folder
    return best


def strip_genex(dep):
    """$<LINK_ONLY:lede::file> -> lede::file; other generator expressions -> ''."""
    m = re.fullmatch(r"\$<LINK_ONLY:([^>]+)>", dep)
    if m:
        return m.group(1)
    return "" if dep.startswith("$<") else dep


def read_targets(path, root):
    """name -> {type, folder (root-relative), sources (root-relative), deps}."""
    targets = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            name, type_, folder, sources, deps = line.split("|", 4)
            rel_folder = os.path.relpath(folder, root)
            srcs = []
            for s in sources.split(";"):
                if not s or s.endswith("-NOTFOUND") or s.startswith("$<"):
                    continue
                full = s if os.path.isabs(s) else os.path.join(folder, s)
                rel = os.path.relpath(os.path.normpath(full), root)
                if not rel.startswith(".."):
                    srcs.append(rel)
            targets[name] = {"type": type_, "folder": rel_folder, "sources": srcs,
                             "deps": [d for d in (strip_genex(x) for x in deps.split(";")) if d]}
    # Resolve lede::x aliases to lede_x, drop third-party dependencies.
    for t in targets.values():
        resolved = []
        for d in t["deps"]:
            real = "lede_" + d[len("lede::"):] if d.startswith("lede::") else d
            if real in targets and real not in resolved:
                resolved.append(real)
        t["deps"] = resolved
    return targets


def closure(targets, name):
    seen, stack = set(), [name]
    while stack:
        for d in targets[stack.pop()]["deps"]:
            if d not in seen:
                seen.add(d)
                stack.append(d)
    return seen


def project_files(root):
    for top in sorted(os.listdir(root)):
        base = os.path.join(root, top)
        if top.startswith(".") or top.startswith("build") or not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fn in sorted(filenames):
                if fn.endswith(SOURCE_EXTS):
                    yield os.path.relpath(os.path.join(dirpath, fn), root)


def check(root, targets):
    """Returns the violations, one message each."""
    ranks = rank_of()
    errors = []
    libraries = {n: t for n, t in targets.items() if t["type"] in LIBRARY_TYPES}
    listed = {}  # file -> targets that list it
    for n, t in targets.items():
        for s in t["sources"]:
            listed.setdefault(s, []).append(n)

    def owner_of_header(rel):
        """(owner target or None, error or None)."""
        if GENERATED_PROTO_RE.match(rel):
            return "lede_proto", None
        if folder_of(rel, ranks) == FREE:
            return None, None
        libs = [n for n in listed.get(rel, []) if n in libraries]
        if libs:
            return libs[0], None
        d = os.path.dirname(rel)
        while d:
            here = sorted(n for n, t in libraries.items() if t["folder"] == d)
            if len(here) == 1:
                return here[0], None
            if len(here) > 1:
                return None, "%s: not listed in any of the targets of %s (%s)" % (rel, d, ", ".join(here))
            if d in ranks:
                break
            d = os.path.dirname(d)
        return None, "%s: no library target owns this header" % rel

    files = list(project_files(root))
    known = set(files)
    folder_edges = {}  # folder -> {included folder: example "file -> header"}
    for rel in files:
        folder = folder_of(rel, ranks)
        if folder is None:
            errors.append("%s: its folder has no layer in LAYERS (tests/build/include_graph_test.py)" % rel)
            continue
        if rel.endswith(".h"):
            owner, err = owner_of_header(rel)
            if err:
                errors.append(err)
            users = [owner] if owner else []
        else:
            users = listed.get(rel, [])
        if rel.endswith(".h") and folder == FREE:
            users = []  # test helpers: checked through the tests that include them
        with open(os.path.join(root, rel), errors="replace") as f:
            includes = INCLUDE_RE.findall(f.read())
        for inc in includes:
            if inc not in known and not GENERATED_PROTO_RE.match(inc):
                continue  # third-party or system
            inc_folder = folder_of(inc, ranks)
            inc_owner, _ = owner_of_header(inc)
            for user in users:
                if inc in targets[user]["sources"]:
                    continue  # a header the target lists itself (e.g. a plugin's interface)
                if inc_owner and inc_owner != user and inc_owner not in closure(targets, user):
                    errors.append("%s includes %s: %s does not depend on %s (add lede::%s to its "
                                  "target_link_libraries)" % (rel, inc, user, inc_owner,
                                                              inc_owner[len("lede_"):]))
            if folder == FREE or inc_folder is None or inc_folder == FREE or inc_folder == folder:
                continue
            folder_edges.setdefault(folder, {}).setdefault(inc_folder, "%s -> %s" % (rel, inc))
            for prefix, banned in FORBIDDEN:
                if (folder == prefix or folder.startswith(prefix + "/")) and inc_folder == banned:
                    errors.append("%s includes %s: %s/ never includes %s/" % (rel, inc, prefix, banned))
            if ranks[inc_folder] >= ranks[folder]:
                errors.append("%s includes %s: %s (layer %d) includes %s (layer %d), which is not below it"
                              % (rel, inc, folder, ranks[folder], inc_folder, ranks[inc_folder]))
    errors.extend(find_cycles(folder_edges))
    return errors


def find_cycles(edges):
    """One message per cycle found by depth-first search of the folder graph."""
    errors, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                errors.append("folder cycle: " + " -> ".join(cycle) + " (closing edge: " +
                              edges[node][nxt] + ")")
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return errors


def self_test():
    """The checker finds each kind of violation in a tiny synthetic tree, and
    passes the same tree once they are fixed."""
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        write("shared/status/status.h", "")
        write("shared/file/file.h", '#include "shared/status/status.h"\n')
        write("shared/file/file.cc", '#include "shared/file/file.h"\n')
        write("policy/controllers.h", '#include "shared/file/file.h"\n')
        write("policy/controllers.cc", '#include "policy/controllers.h"\n')
        write("tests/policy/policy_test.cc", '#include "policy/controllers.h"\n')
        lines = ["lede_status|STATIC_LIBRARY|%s/shared/status|status.h|" % root,
                 "lede_file|STATIC_LIBRARY|%s/shared/file|file.cc;file.h|lede::status" % root,
                 "lede_policy|STATIC_LIBRARY|%s/policy|controllers.cc;controllers.h|lede::file" % root,
                 "policy_test|EXECUTABLE|%s/tests/policy|policy_test.cc|lede::policy;GTest::gtest" % root]
        targets_file = os.path.join(root, "targets.txt")
        write("targets.txt", "\n".join(lines) + "\n")
        clean = check(root, read_targets(targets_file, root))
        assert clean == [], clean

        # An undeclared dependency: lede_policy no longer links lede::file.
        write("targets.txt", "\n".join(lines).replace("controllers.h|lede::file", "controllers.h|lede::status") + "\n")
        errs = check(root, read_targets(targets_file, root))
        assert any("policy/controllers.h includes shared/file/file.h: lede_policy does not depend on lede_file"
                   in e for e in errs), errs
        write("targets.txt", "\n".join(lines) + "\n")

        # An upward include and the cycle it closes.
        write("shared/file/file.cc", '#include "shared/file/file.h"\n#include "policy/controllers.h"\n')
        errs = check(root, read_targets(targets_file, root))
        assert any("shared/file (layer 1) includes policy (layer 5)" in e for e in errs), errs
        assert any(e.startswith("folder cycle: ") for e in errs), errs
        write("shared/file/file.cc", '#include "shared/file/file.h"\n')

        # policy/ never includes proto/.
        write("policy/controllers.cc", '#include "policy/controllers.h"\n#include "proto/lede/v1/policy.pb.h"\n')
        errs = check(root, read_targets(targets_file, root))
        assert any("policy/ never includes proto/" in e for e in errs), errs
        write("policy/controllers.cc", '#include "policy/controllers.h"\n')

        # A folder without a layer.
        write("newlib/thing.h", "")
        errs = check(root, read_targets(targets_file, root))
        assert any(e.startswith("newlib/thing.h: its folder has no layer") for e in errs), errs
        os.remove(os.path.join(root, "newlib/thing.h"))
        assert check(root, read_targets(targets_file, root)) == []
    print("self-test: ok")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(argv[2] if len(argv) == 3 else os.path.join(os.path.dirname(__file__), "..", ".."))
    targets = read_targets(argv[1], root)
    errors = check(root, targets)
    for e in errors:
        print(e)
    if errors:
        print("%d violation(s)" % len(errors))
        return 1
    print("include graph: %d targets, no violation" % len(targets))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
