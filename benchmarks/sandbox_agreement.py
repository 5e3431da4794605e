"""How often do sim, local and docker agree on the same episode? (target: 100%)

For generated code tasks, plays the oracle's episode, a no-op sequence and random edit sequences
(``compactrl.testing.sandbox_fidelity``) on every backend, and counts the episodes whose files,
must-pass verdicts, reward/termination and file-tool observations agree with the sim's. Every
disagreement is printed with its class (what differed) and the action sequence that caused it.

    python benchmarks/sandbox_agreement.py [--backends sim,local,docker] [--tasks 10] [--random 10]
        [--difficulty easy] [--quiet]
    compactrl bench sandbox_agreement

``docker`` needs an engine (``DOCKER_HOST``; ``scripts/ci_docker.sh`` starts Podman's) holding
``compactrl-sandbox:latest``.
"""

from __future__ import annotations

import argparse
import collections
import random
import time

from compactrl.tasksets.generators.code import CodeTaskGenerator, task_seed_for
from compactrl.testing import sandbox_fidelity as F


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sim,local", help="comma-separated; the first is the reference")
    parser.add_argument("--tasks", type=int, default=10, help="generated tasks (test split)")
    parser.add_argument("--random", type=int, default=10, help="random edit sequences per task")
    parser.add_argument("--difficulty", default="easy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="do not print each disagreement")
    args = parser.parse_args()
    backends = args.backends.split(",")
    gen = CodeTaskGenerator(args.difficulty)
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    classes: collections.Counter = collections.Counter()
    aspects: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)  # episodes
    started = time.monotonic()
    for i in range(args.tasks):
        task = gen.generate(task_seed_for("test", i))
        rng = random.Random(f"{args.seed}:{i}")
        noop = F.noop_actions(task, rng)
        sources = [("oracle", F.oracle_actor), ("noop", lambda a=noop: F.scripted_actor(a))]
        for k in range(args.random):
            acts = F.random_edit_actions(task, random.Random(f"{args.seed}:{i}:{k}"))
            sources.append(("random", lambda a=acts: F.scripted_actor(a)))
        for kind, factory in sources:
            outcomes, diffs = F.compare(task, backends, factory)
            totals[kind][1] += 1
            totals[kind][0] += not diffs
            for aspect in {a for _, a, _ in diffs}:
                aspects[kind][aspect] += 1
            for backend, aspect, detail in diffs:
                classes[(backend, aspect, detail.split(";")[0] if ";" in detail else "")] += 1
                if not args.quiet:
                    print(f"DISAGREE {kind} {task.id} {backend} {aspect}: {detail}")
                    print("  actions: " + " | ".join(a.replace("\n", "\\n")[:120] for a in outcomes[0].actions))
    elapsed = time.monotonic() - started
    print(f"\nagreement with {backends[0]} on {args.difficulty} tasks ({', '.join(backends[1:])}), "
          f"{elapsed:.0f} s:")
    names = ["files", "verdict", "reward", "observation", "sandbox"]
    print(f"{'sequences':<10} {'agree':>6} {'total':>6} {'rate':>7}   target | "
          + " ".join(f"{a + ' ok':>14}" for a in names))
    for kind in ("oracle", "noop", "random"):
        ok, n = totals[kind]
        per = [n - aspects[kind][name] for name in names]
        print(f"{kind:<10} {ok:>6} {n:>6} {ok / max(n, 1):>7.1%}   100%   | "
              + " ".join(f"{p / max(n, 1):>14.1%}" for p in per))
    if classes:
        print("disagreement classes (backend, aspect, class -> occurrences):")
        for (backend, aspect, cls), n in classes.most_common():
            print(f"  {backend:<7} {aspect:<12} {cls or '(other)':<20} {n}")


if __name__ == "__main__":
    main()
