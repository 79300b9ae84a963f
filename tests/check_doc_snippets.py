#!/usr/bin/env python3
"""The documentation's C++ examples stay compiled: every ```cpp block of README.md and docs/*.md
must be covered by tests/test_readme.cpp (the GPU notes' example by tests/cuda/test_cuda_readme.cpp,
which needs the CUDA backend).

A block is covered when each of its code lines occurs in the test file, in the block's order: the
block's lines are a subsequence of the file's lines. Both sides are compared after normalising
whitespace (runs of blanks become one space, ends stripped) and dropping comments (a trailing `//`
comment, and inline `/* ... */` ones such as `/*keepdim=*/`); in the block, blank lines, lines
that are only a comment and lines that are only `...` are skipped. The test may put setup and
checks between the lines (a test case wraps the snippet), but it may not change, drop or reorder
them. The few lines that differ today are listed, each with its reason, in KNOWN_DIFFERENCES below.

Only fences opened with ```cpp count: shell commands, program output and CMake use other fence
languages and are not checked.

Usage: check_doc_snippets.py [--verbose] [ROOT]
  ROOT       the source tree (default: the parent of this file's folder)
  --verbose  also list the lines excused by KNOWN_DIFFERENCES
Exit status 0 when every block is covered; 1 when a line is missing (each printed with its page
and line number) or an entry of KNOWN_DIFFERENCES is stale; 2 on a usage error.
CTest runs it as `docs:snippets`.
"""

import re
import sys
from pathlib import Path

# Where the examples are compiled: test_readme.cpp for everything but the GPU notes' example, which
# needs the CUDA backend and is compiled in every CUDA build (run where a GPU is).
TEST_FILES = ("tests/test_readme.cpp", "tests/cuda/test_cuda_readme.cpp")

# Lines of the pages that differ from the compiled code, each with the reason. A block's other
# lines must still be in the test file, in order. An entry that no longer differs (the test or the
# page was brought in line), or whose line left the page, fails the check until it is removed here.
# Keep this list short: copy a new block into the test as written instead of adding to it.
KNOWN_DIFFERENCES = [
    # README.md, Quick start: a whole program; the test runs its body in a TEST_CASE and saves to
    # a name of its own.
    ("README.md", '#include <tandem/tandem.h>   // or "tandem.h" inside this tree', "a program, not a test case"),
    ("README.md", "int main() {", "a program, not a test case"),
    ("README.md", 'nn::save_model(model, "model.safetensors");', "the test saves to a path variable"),
    # docs/api.md, Tensors
    ("docs/api.md", "std::vector<float> v = d.to_vector<float>();", "not in the test"),
    ("docs/api.md", 'std::cout << d << "\\n";', "the test prints into an ostringstream"),
    # docs/api.md, Autograd
    ("docs/api.md", "{ NoGradGuard no_grad; w.sub_(w.grad() * 0.1); }", "three lines in the test"),
    ("docs/api.md", "HookHandle h2 = register_post_accumulate_grad_hook(w, [](const Tensor& p) {",
     "the test's lambda captures [&] to count the calls"),
    ("docs/api.md", "autograd::queue_callback([] { /* runs after the whole backward */ });",
     "the test's lambda captures [&] to count the calls"),
    # docs/api.md, nn and optim: the test writes readme_*.safetensors
    ("docs/api.md", 'nn::save_model(net, "net.safetensors");', "the test's file name"),
    ("docs/api.md", 'nn::save_optimizer(adamw, "opt.safetensors");', "the test's file name"),
    ("docs/api.md", 'nn::load_model(net, "net.safetensors");', "the test's file name, and it loads into another Net"),
    # docs/ddp.md, Process groups and collectives, TANDEM_DIST_PROGRESS, BlockingIssueGuard
    ("docs/ddp.md", "dist::run_threads(4, [](dist::ProcessGroup& g) {", "the test's lambda captures [&] to check the results"),
    ("docs/ddp.md", "compute_something_else();", "a placeholder for the reader's code"),
    ("docs/ddp.md", "for (auto& chunk : work_items) {", "a placeholder for the reader's code"),
    ("docs/ddp.md", "process(chunk);", "a placeholder for the reader's code"),
    ("docs/ddp.md", "pg->broadcast(params, 0);", "the test wraps it in REQUIRE(... ->is_completed())"),
    # docs/join-zero.md, ZeroRedundancyOptimizer: the test writes readme_optimizer.safetensors
    ("docs/join-zero.md", 'if (pg->rank() == 0) nn::save_safetensors("optimizer.safetensors", opt.state_dict());',
     "the test's file name"),
    ("docs/join-zero.md", 'opt.load_state_dict(nn::load_safetensors("optimizer.safetensors"));', "the test's file name"),
    # docs/mpirun.md, the flight recorder: the test writes readme_flight.json
    ("docs/mpirun.md", 'std::string path = dist::dump_flight_recorder("after epoch 3", "flight.json");',
     "the test's file name"),
]

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")


def strip_comments(line):
    """Drops a trailing `//` comment and inline `/* ... */` comments (`a.sum({1}, /*keepdim=*/true)`)
    that are outside string and character literals."""
    out = []
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                out.append(line[i:i + 2])
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            end = line.find("*/", i + 2)
            if end < 0:
                break
            i = end + 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def normalise(line):
    return " ".join(strip_comments(line).split())


def is_skipped(raw):
    s = raw.strip()
    if not s or s == "...":
        return True
    if s.startswith("//"):
        return True
    if s.startswith("/*") and s.endswith("*/") and "*/" not in s[2:-2]:
        return True
    return False


def cpp_blocks(path):
    """Yields (first line number, [(line number, raw line), ...]) for each ```cpp block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(2), m.group(3).lower()
        start = i + 1
        body = []
        i += 1
        while i < len(lines):
            close = lines[i].strip()
            if close.startswith(fence[0] * len(fence)) and close.strip(fence[0]) == "":
                break
            body.append((i + 1, lines[i]))
            i += 1
        i += 1  # past the closing fence
        if lang == "cpp":
            yield start, body


def matched_positions(block, corpus):
    """Indices into `block` that belong to a longest common subsequence with `corpus`."""
    n, m = len(block), len(corpus)
    # best[i][j]: length of the LCS of block[i:] and corpus[j:]
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = best[i], best[i + 1]
        bi = block[i]
        for j in range(m - 1, -1, -1):
            if bi == corpus[j]:
                row[j] = below[j + 1] + 1
            else:
                row[j] = below[j] if below[j] >= row[j + 1] else row[j + 1]
    found = set()
    i = j = 0
    while i < n and j < m:
        if block[i] == corpus[j]:
            found.add(i)
            i += 1
            j += 1
        elif best[i + 1][j] >= best[i][j + 1]:
            i += 1
        else:
            j += 1
    return found


def main(argv):
    args = argv[1:]
    verbose = "--verbose" in args
    args = [a for a in args if a != "--verbose"]
    if len(args) > 1 or any(a.startswith("-") for a in args):
        print(__doc__.strip())
        return 2
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    pages = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    for p in [root / t for t in TEST_FILES] + pages:
        if not p.is_file():
            print(f"check_doc_snippets: {p} not found", file=sys.stderr)
            return 2

    corpora = []
    for t in TEST_FILES:
        lines = [normalise(line) for line in (root / t).read_text(encoding="utf-8").splitlines()]
        corpora.append((t, [line for line in lines if line]))
    known = {(page, normalise(line)): reason for page, line, reason in KNOWN_DIFFERENCES}

    blocks = checked_lines = 0
    per_file = {t: 0 for t in TEST_FILES}
    missing = []  # (page, block start, closest test file, [(line number, raw line), ...])
    excused = []  # (page, line number, raw line, reason)
    seen_known = set()
    for page in pages:
        rel = page.relative_to(root).as_posix()
        for start, body in cpp_blocks(page):
            code = [(no, raw) for no, raw in body if not is_skipped(raw) and normalise(raw)]
            blocks += 1
            checked_lines += len(code)
            wanted = [normalise(raw) for _, raw in code]
            # The test file that holds most of the block, in order.
            best_file, found = max(((t, matched_positions(wanted, corpus)) for t, corpus in corpora),
                                   key=lambda tf: len(tf[1]))
            per_file[best_file] += 1
            lost = []
            for k, (no, raw) in enumerate(code):
                if k in found:
                    continue
                key = (rel, wanted[k])
                if key in known:
                    seen_known.add(key)
                    excused.append((rel, no, raw.strip(), known[key]))
                else:
                    lost.append((no, raw))
            if lost:
                missing.append((rel, start, best_file, lost))
    stale = [(page, line) for page, line in known if (page, line) not in seen_known]

    if missing:
        total = sum(len(lost) for *_, lost in missing)
        print(f"check_doc_snippets: {total} line(s) of {len(missing)} ```cpp block(s) are not in "
              f"{' or '.join(TEST_FILES)} (in the block's order):")
        for rel, start, best_file, lost in missing:
            print(f"  {rel}:{start}: the block opened here (closest: {best_file})")
            for no, raw in lost:
                print(f"    {rel}:{no}: {raw.strip()}")
        print("Copy each block into a TEST_CASE of tests/test_readme.cpp as written (setup and checks may "
              "go between its lines), or bring the page back in line with the compiled code.")
    if stale:
        print(f"check_doc_snippets: {len(stale)} line(s) of KNOWN_DIFFERENCES in tests/check_doc_snippets.py "
              f"no longer differ from the test, or left their page; remove them from the list:")
        for page, line in stale:
            print(f"  {page}: {line}")
    if missing or stale:
        return 1
    where = ", ".join(f"{n} by {t}" for t, n in per_file.items())
    print(f"check_doc_snippets: {blocks} ```cpp blocks ({checked_lines} code lines) in {len(pages)} pages, "
          f"all covered: {where}; {len(excused)} line(s) excused by KNOWN_DIFFERENCES"
          + (":" if verbose else " (--verbose lists them)"))
    if verbose:
        for rel, no, raw, reason in excused:
            print(f"  {rel}:{no}: {raw}    [{reason}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
