"""The summary advantage gap under bootstrap and cut GAE, exactly, on the summary MDP.

Prints the table docs/credit_assignment.md quotes: for each lambda, the expected advantage of a
summary that kept the right value minus that of one that kept a look-alike, with a perfect
critic, under ``boundary="bootstrap"`` and ``"cut"`` (see :mod:`compactrl.algos.boundary_bias`),
and the SD of that advantage around its mean (the outcome's noise that reaches the summary), each
cross-checked against ``trace_gae`` on the MDP's four trajectories. A second table varies how
many policy tokens of the next trace hide which value was kept.

    python benchmarks/boundary_bias.py
    python benchmarks/boundary_bias.py --hidden 20 --lambdas 0.9,0.95,0.99,adaptive,1
"""

from __future__ import annotations

import argparse
import dataclasses

from compactrl.algos.boundary_bias import (
    ADAPTIVE,
    SummaryChain,
    expected_summary_advantage,
    gap_table,
    trace_gae_summary_advantage,
)


def lambda_table(chain: SummaryChain, lambdas, alpha: float) -> list[str]:
    lines = ["| lambda | bootstrap gap | bootstrap SD | (trace_gae gap, SD) | cut gap | cut SD | (trace_gae gap, SD) "
             "| ideal gap |", "|---|---|---|---|---|---|---|---|"]
    for row in gap_table(chain, lambdas, alpha=alpha):
        lam = row["lambda"]
        name = (f"adaptive 1 - 1/(1.5 l) (bootstrap {row['bootstrap_lambda']:.4f}, cut {row['cut_lambda']:.4f})"
                if lam == ADAPTIVE else f"{lam:g}")
        cells = [name]
        for b in ("bootstrap", "cut"):
            m = trace_gae_summary_advantage(chain, lam, b, alpha=alpha)
            cells += [f"{row[b]:.3f}", f"{row[b + '_sd']:.4f}", f"({m['right'] - m['wrong']:.3f}, {m['sd']:.4f})"]
        lines.append("| " + " | ".join(cells) + f" | {row['ideal']:.3f} |")
    return lines


def hidden_table(chain: SummaryChain, lambdas, alpha: float, hiddens=(0, 5, 25, 75, 125)) -> list[str]:
    names = ["adaptive" if lam == ADAPTIVE else f"{lam:g}" for lam in lambdas]
    lines = ["| hidden tokens | " + " | ".join(f"bootstrap {n}" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for h in hiddens:
        c = dataclasses.replace(chain, hidden=h, after=max(chain.hidden + chain.after - h, 1))
        gaps = [expected_summary_advantage(c, lam, "bootstrap", alpha=alpha) for lam in lambdas]
        lines.append(f"| {h} | " + " | ".join(f"{g['right'] - g['wrong']:.3f}" for g in gaps) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    d = SummaryChain()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(SummaryChain):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(d, f.name)), default=getattr(d, f.name),
                       help=f"(default {getattr(d, f.name)})")
    p.add_argument("--lambdas", default="0.9,0.95,0.99,adaptive,1", help="comma-separated, 'adaptive' allowed")
    p.add_argument("--alpha", type=float, default=1.5, help="alpha of the length-adaptive lambda")
    args = p.parse_args(argv)
    chain = SummaryChain(**{f.name: getattr(args, f.name) for f in dataclasses.fields(SummaryChain)})
    lambdas = [ADAPTIVE if s.strip() == ADAPTIVE else float(s) for s in args.lambdas.split(",")]
    print(f"MDP: {chain} -> {chain.length} policy tokens, {chain.length - 1 - chain.summary_at} "
          f"from the summary to the outcome\n")
    print("Gap: E[A | right summary] - E[A | wrong summary] at the summary token; SD: the summary advantage's "
          "SD around that mean (the outcome's noise that reaches it).\n")
    print("\n".join(lambda_table(chain, lambdas, args.alpha)))
    print(f"\nBootstrap gap by how many tokens of the next trace hide the kept value "
          f"({chain.hidden + chain.after} from the summary to the outcome in every row):\n")
    print("\n".join(hidden_table(chain, lambdas, args.alpha)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
