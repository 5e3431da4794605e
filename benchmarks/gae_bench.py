"""GAE throughput: compactrl's blocked scan vs TorchRL vs per-step loops, side by side.

    python benchmarks/gae_bench.py                 # T = 1e3 .. 1e6, both (gamma, lambda) settings
    python benchmarks/gae_bench.py --sizes 1000 100000 --repeats 20 --threads 1
    python benchmarks/gae_bench.py --threads-table # gae's threading: default vs one thread, idle and loaded

One stream of T tokens (batch 1) with episode ends at random (1 in 10^4 tokens) and at the end.
``--threads-table`` instead times compactrl's ``gae`` alone, (gamma, lambda) = (0.99, 0.95), as a
user calls it (torch's default threads; ``gae`` picks its own, ``compactrl.algos.gae.THREADS``),
with ``torch.set_num_threads(1)``, and with torch's threads inside the scan (``THREADS = None``,
the behaviour before ``gae`` picked), on the machine as it is ("idle") and with
``--burners`` CPU-burning processes that the benchmark starts itself ("loaded").
Every method gets the same inputs; the table shows tokens per second (best of ``--repeats`` runs,
the machine is shared; the median is in ``--json``). Entries marked ``~`` were not run because
the previous size predicts more than ``--cap`` seconds; they are extrapolated from the last two
measured sizes (TorchRL's vectorised GAE costs O(T^2) when gamma * lambda is near 1).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import torch
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate,
    vec_generalized_advantage_estimate,
)

from compactrl.algos import gae as gae_module
from compactrl.algos.gae import gae


def make_stream(t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    reward, value = torch.randn(t, generator=g), torch.randn(t, generator=g)
    done = torch.rand(t, generator=g) < 1e-4
    done[-1] = True
    next_state = torch.cat([value[1:], value.new_zeros(1)]).masked_fill(done, 0.0)
    return reward, value, done, next_state


def python_loop(reward: list[float], value: list[float], done: list[bool], gamma: float, lmbda: float):
    """The textbook per-step loop over Python floats."""
    out, nxt = [0.0] * len(reward), 0.0
    for t in range(len(reward) - 1, -1, -1):
        end = done[t] or t == len(reward) - 1
        nxt = reward[t] - value[t] + (0.0 if end else gamma * value[t + 1] + gamma * lmbda * nxt)
        out[t] = nxt
    return out


def methods(gamma: float, lmbda: float) -> dict[str, Callable]:
    def ours(r, v, d, ns, lists):
        return gae(r, v, d, gamma=gamma, lmbda=lmbda)[0]

    def trl_vec(r, v, d, ns, lists):
        return vec_generalized_advantage_estimate(
            gamma, lmbda, v[:, None], ns[:, None], r[:, None], d[:, None]
        )[0]

    def trl_loop(r, v, d, ns, lists):
        return generalized_advantage_estimate(gamma, lmbda, v[:, None], ns[:, None], r[:, None], d[:, None])[
            0
        ]

    def py_loop(r, v, d, ns, lists):
        return python_loop(*lists, gamma, lmbda)

    return {
        "compactrl gae": ours,
        "TorchRL vec_generalized_advantage_estimate": trl_vec,
        "TorchRL generalized_advantage_estimate (loop)": trl_loop,
        "Python per-step loop": py_loop,
    }


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def time_it(fn: Callable, args, repeats: int, warm_up: bool, clock: Callable[[], float]):
    out = fn(*args) if warm_up else None  # allocator, caches
    times = []
    for _ in range(repeats):
        t0 = clock()
        out = fn(*args)
        times.append(clock() - t0)
    return times, out


def run(sizes: list[int], settings: list[tuple[float, float]], repeats: int, cap: float, clock) -> list[dict]:
    rows = []
    for gamma, lmbda in settings:
        fns = methods(gamma, lmbda)
        history: dict[str, list[tuple[int, float]]] = {name: [] for name in fns}
        for t in sizes:
            r, v, d, ns = make_stream(t)
            args = (r, v, d, ns, (r.tolist(), v.tolist(), d.tolist()))
            exact = torch.tensor(python_loop(*args[-1], gamma, lmbda), dtype=torch.float64)
            scale = max(float(exact.abs().max()), 1e-12)
            for name, fn in fns.items():
                hist = history[name]
                predicted = _extrapolate(hist, t)
                if predicted is not None and predicted > cap:
                    rows.append(
                        dict(
                            gamma=gamma,
                            lmbda=lmbda,
                            T=t,
                            method=name,
                            seconds=predicted,
                            median=predicted,
                            extrapolated=True,
                            rel_error=None,
                        )
                    )
                    continue
                reps = (
                    repeats if predicted is None else int(min(repeats, max(1, cap // max(predicted, 1e-9))))
                )
                times, out = time_it(fn, args, reps, predicted is None or predicted < 1.0, clock)
                best = min(times)
                hist.append((t, best))
                other = torch.as_tensor(out, dtype=torch.float64).reshape(-1)
                diff = float((other - exact).abs().max()) / scale
                rows.append(
                    dict(
                        gamma=gamma,
                        lmbda=lmbda,
                        T=t,
                        method=name,
                        seconds=best,
                        median=statistics.median(times),
                        extrapolated=False,
                        rel_error=diff,
                    )
                )
                print(
                    f"  gamma={gamma} lambda={lmbda} T={t:>8} {name:48s} {t / best:12.3e} tokens/s",
                    file=sys.stderr,
                )
    return rows


def _extrapolate(hist: list[tuple[int, float]], t: int) -> float | None:
    if not hist:
        return None
    if len(hist) == 1:
        (t1, s1), power = hist[-1], 1.0
    else:
        (t0, s0), (t1, s1) = hist[-2], hist[-1]
        power = max(1.0, min(2.0, _log_ratio(s1, s0) / _log_ratio(t1, t0)))
    return s1 * (t / t1) ** power


def _log_ratio(a: float, b: float) -> float:
    return math.log(max(a, 1e-9) / max(b, 1e-9))


def table(rows: list[dict], sizes: list[int]) -> str:
    lines = []
    for gamma, lmbda in dict.fromkeys((r["gamma"], r["lmbda"]) for r in rows):
        lines.append(f"\n(gamma, lambda) = ({gamma}, {lmbda}); tokens/s, best of the repeats\n")
        lines.append("| method | " + " | ".join(f"T = {t:.0e}" for t in sizes) + " |")
        lines.append("|---|" + "---:|" * len(sizes))
        for name in dict.fromkeys(r["method"] for r in rows):
            cells = []
            for t in sizes:
                hit = [
                    r
                    for r in rows
                    if (r["gamma"], r["lmbda"], r["T"], r["method"]) == (gamma, lmbda, t, name)
                ]
                if not hit:
                    cells.append("")
                    continue
                mark = "~" if hit[0]["extrapolated"] else ""
                cells.append(f"{mark}{t / hit[0]['seconds']:.2e}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        speed = []
        for t in sizes:
            ours = [
                r
                for r in rows
                if (r["gamma"], r["lmbda"], r["T"], r["method"]) == (gamma, lmbda, t, "compactrl gae")
            ]
            trl = [
                r
                for r in rows
                if (r["gamma"], r["lmbda"], r["T"]) == (gamma, lmbda, t)
                and r["method"].startswith("TorchRL vec")
            ]
            speed.append(f"{trl[0]['seconds'] / ours[0]['seconds']:.1f}x" if ours and trl else "")
        lines.append("| speed-up vs TorchRL vec | " + " | ".join(speed) + " |")
    return "\n".join(lines)


def _errors(rows: list[dict]) -> dict:
    out = {}
    for r in rows:
        if r["rel_error"] is not None:
            out[(r["gamma"], r["lmbda"], r["method"])] = f"{r['rel_error']:.1e} (T = {r['T']:.0e})"
    return out


def _burn(stop) -> None:
    while not stop.is_set():
        pass


@contextlib.contextmanager
def cpu_burners(n: int) -> Iterator[None]:
    """``n`` processes spinning on a CPU each for the duration of the block (the "loaded" case)."""
    ctx = multiprocessing.get_context("fork")  # the children never touch torch
    stop = ctx.Event()
    procs = [ctx.Process(target=_burn, args=(stop,), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


THREAD_MODES = ("default", "one thread", "torch threads in the scan")


@contextlib.contextmanager
def thread_mode(mode: str, default_threads: int) -> Iterator[None]:
    """``default``: as a user calls ``gae``; ``one thread``: ``torch.set_num_threads(1)``;
    ``torch threads in the scan``: ``gae.THREADS = None`` (torch's threads, as before ``gae`` picked)."""
    saved = gae_module.THREADS
    torch.set_num_threads(1 if mode == "one thread" else default_threads)
    gae_module.THREADS = None if mode == "torch threads in the scan" else saved
    try:
        yield
    finally:
        gae_module.THREADS = saved
        torch.set_num_threads(default_threads)


def _gae_call(r, v, d):
    return gae(r, v, d, gamma=0.99, lmbda=0.95)


def threads_table(sizes: list[int], repeats: int, burners: int) -> tuple[list[dict], str]:
    """Tokens/s of ``gae`` per size, thread mode and load; rows and a markdown table."""
    default_threads = torch.get_num_threads()
    rows = []
    for load in ("idle", "loaded"):
        with cpu_burners(burners if load == "loaded" else 0):
            for t in sizes:
                r, v, d, _ = make_stream(t)
                times: dict[str, list[float]] = {mode: [] for mode in THREAD_MODES}
                # default and one thread interleaved (each sees the same load; rep 0 warms up); torch's
                # threads after, on their own: their idle workers spin for a while and would slow the others
                for modes in (THREAD_MODES[:2], THREAD_MODES[2:]):
                    for rep in range(repeats + 1):
                        for mode in modes:
                            with thread_mode(mode, default_threads):
                                took = time_it(_gae_call, (r, v, d), 1, False, time.perf_counter)[0]
                            times[mode] += took if rep else []
                for mode, ts in times.items():
                    rows.append(dict(load=load, T=t, mode=mode, seconds=min(ts), median=statistics.median(ts)))
                    print(f"  {load} T={t:>8} {mode:26s} {t / min(ts):10.3e} tokens/s", file=sys.stderr)
    head = " | ".join(f"{load}: {m}" for load in ("idle", "loaded") for m in THREAD_MODES)
    lines = [f"| T | {head} | loaded: one thread / default |", "|---:|" + "---:|" * (2 * len(THREAD_MODES) + 1)]
    for t in sizes:
        cell = {(r["load"], r["mode"]): t / r["seconds"] for r in rows if r["T"] == t}
        ratio = cell[("loaded", "one thread")] / cell[("loaded", "default")]
        values = " | ".join(f"{cell[(load, m)]:.2e}" for load in ("idle", "loaded") for m in THREAD_MODES)
        lines.append(f"| {t:.0e} | {values} | {ratio:.2f} |")
    return rows, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--cap", type=float, default=30.0, help="seconds one call may be predicted to take")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--json", type=str, default=None, help="write every measurement to this file")
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time; cpu: CPU time of the calling thread (use with --threads 1 on a shared machine)",
    )
    p.add_argument("--threads-table", action="store_true",
                   help="time gae's threading (default vs one thread, idle and loaded) instead")
    p.add_argument("--burners", type=int, default=1, help="CPU-burning processes in the loaded case")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.threads_table:
        rows, text = threads_table(args.sizes, args.repeats, args.burners)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} default threads, {os.cpu_count()} CPUs, "
              f"load average before {os.getloadavg()[0]:.1f}, {args.burners} burner(s) when loaded; "
              "gae tokens/s, best of the repeats, (gamma, lambda) = (0.99, 0.95)")
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    settings = [(0.99, 0.95), (1.0, 0.9999)]
    rows = run(args.sizes, settings, args.repeats, args.cap, CLOCKS[args.clock])
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock; "
        "one stream, episode ends ~1/1e4 tokens"
    )
    print(table(rows, args.sizes))
    print("\nmax |A - A_float64 loop| / max |A_float64 loop| at the largest measured T:")
    for (gamma, lmbda, name), err in _errors(rows).items():
        print(f"  ({gamma}, {lmbda}) {name}: {err}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
