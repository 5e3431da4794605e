"""Sim shell vs real bash: the agreement rate on random command lines, and the speed of each.

    python benchmarks/shell_agreement.py                 # 2000 cases, seed 0
    python benchmarks/shell_agreement.py --cases 500 --seed 3 --show 5
    python benchmarks/shell_agreement.py --corpus        # the trajectory corpus, per construct

Each case is a random file tree and a random command line from the documented subset
(``compactrl.testing.shell_agreement``); it runs in the emulator and in ``bash -c`` in a temp dir
(``LC_ALL=C.UTF-8``). A case agrees when stdout, stderr, exit code, final files and directories
all match. Reference: target 100% on the documented subset (docs/terminal.md lists every known
disagreement class, none of which the generator produces). Speed: emulator command lines per
second vs a fresh ``bash -c`` per command line (both on the same cases, single process).

``--corpus`` runs instead the commands of ``tests/fixtures/shell_corpus`` (taken from public agent
trajectories, see its README) over that corpus's fixture tree and prints the agreement per
construct (a command counts under every construct it contains). Target: >= 98% overall.
"""

from __future__ import annotations

import argparse
import collections
import random
import time

from compactrl.testing.shell_agreement import (
    check_case,
    constructs_of,
    corpus_case,
    load_corpus,
    random_case,
    run_real,
    run_sim,
)

TARGET = 1.0
CORPUS_TARGET = 0.98
CORPUS_DIR = "tests/fixtures/shell_corpus"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=3, help="disagreements to print in full")
    parser.add_argument("--corpus", action="store_true", help="run the trajectory corpus instead")
    args = parser.parse_args()
    if args.corpus:
        corpus(args.show)
        return

    agree, kinds, shown = 0, collections.Counter(), 0
    commands = collections.Counter()
    sim_s = real_s = 0.0
    for i in range(args.cases):
        case = random_case(random.Random(args.seed * 1_000_003 + i))
        commands.update({w for w in case.command.replace("|", " ").split() if w.isalpha()} & _KNOWN)
        diffs, real, sim = check_case(case)
        agree += not diffs
        kinds.update(diffs)
        if diffs and shown < args.show:
            shown += 1
            print(f"--- disagreement: {case.command!r} differs in {diffs}")
            for d in diffs:
                if d in ("stdout", "stderr", "exit_code"):
                    print(f"  real {d}: {getattr(real, d)!r}\n   sim {d}: {getattr(sim, d)!r}")
        if i < 300:  # timing on a subset: each side alone
            t0 = time.perf_counter()
            _, root = run_real(case)
            t1 = time.perf_counter()
            run_sim(case, root)
            t2 = time.perf_counter()
            real_s, sim_s = real_s + (t1 - t0), sim_s + (t2 - t1)
    timed = min(args.cases, 300)
    rate = agree / args.cases
    print(f"cases                      {args.cases}")
    print(f"agreement                  {rate:.4f}   (target {TARGET:.2f})  {'OK' if rate >= TARGET else 'BELOW TARGET'}")
    print(f"disagreements by aspect    {dict(kinds) or '{}'}")
    print(f"emulator  command lines/s  {timed / sim_s:,.0f}   (includes setting up the in-memory tree)")
    print(f"bash -c   command lines/s  {timed / real_s:,.0f}   (includes writing the tree to a temp dir)")
    print(f"commands exercised         {len(commands)}: {' '.join(sorted(commands))}")


def corpus(show: int) -> None:
    tree, items = load_corpus(CORPUS_DIR)
    total, bad = collections.Counter(), collections.Counter()
    failures = []
    for item in items:
        diffs, real, sim = check_case(corpus_case(tree, item["command"]))
        for name in constructs_of(item["command"]):
            total[name] += 1
            bad[name] += bool(diffs)
        if diffs:
            failures.append((item, diffs, real, sim))
    for item, diffs, real, sim in failures[:show]:
        print(f"--- disagreement ({item['source']}): {item['command']!r} differs in {diffs}")
        for d in diffs:
            if d in ("stdout", "stderr", "exit_code"):
                print(f"  real {d}: {str(getattr(real, d))[:300]!r}\n   sim {d}: {str(getattr(sim, d))[:300]!r}")
    rate = 1 - len(failures) / len(items)
    print("| construct | commands | agree | rate |\n| --- | --- | --- | --- |")
    for name, n in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {n} | {n - bad[name]} | {(n - bad[name]) / n:.3f} |")
    print(f"| **all** | {len(items)} | {len(items) - len(failures)} | **{rate:.4f}** |")
    print(f"corpus agreement {rate:.4f} (target {CORPUS_TARGET:.2f})  {'OK' if rate >= CORPUS_TARGET else 'BELOW TARGET'}")


_KNOWN = {"cat", "head", "tail", "wc", "grep", "sort", "uniq", "cut", "tr", "sed", "awk", "find", "ls", "echo",
          "printf", "mkdir", "rm", "rmdir", "cp", "mv", "touch", "cd", "pwd", "test", "true", "false", "seq",
          "basename", "dirname", "tee", "exit", "for", "while", "until", "if", "case", "read", "xargs", "paste",
          "nl", "rev", "tac", "comm", "diff", "expr", "bc", "column", "realpath", "set", "shift", "local", "let"}


if __name__ == "__main__":
    main()
