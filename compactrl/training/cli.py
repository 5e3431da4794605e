"""``compactrl train``: SFT warm start, then PPO or GRPO, into a run directory.

Every field of :class:`~compactrl.training.config.TrainConfig` is an option ``--<section>.<field>``
whose help is the field's docstring; options given on the command line override the preset.
``--resume`` continues the run in ``--out`` (or the newest run under ``runs/``) from its last
checkpoint, with the configuration stored in that run; ``--resume --rl.iterations N`` also
extends it to ``N`` iterations (a finished run continues from its last checkpoint).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any

from compactrl.cli_options import Applies, refuse_ignored, track_given
from compactrl.training.config import PRESETS, TrainConfig, iter_fields, override, preset

log = logging.getLogger(__name__)

RUNS_ROOT = Path("runs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    # a bad value: one line naming the option and what it accepts (argparse prints the whole usage,
    # ~100 options, before its message)
    parser.error = lambda message: parser.exit(2, f"compactrl train: error: {message}\n")  # type: ignore[method-assign]
    parser.add_argument("--preset", default="main", choices=sorted(PRESETS),
                        help="named configuration to start from")
    parser.add_argument("--algo", choices=("ppo", "grpo"), default=None, help="shortcut for --rl.algo")
    parser.add_argument("--out", default=None,
                        help="run directory (default: runs/<preset>-<algo>-<time>; with --resume: the newest run)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its last checkpoint (its stored config is used; "
                             "--rl.iterations N extends it)")
    parser.add_argument("--config", default=None, help="a config.json to start from instead of a preset")
    parser.add_argument("--no-progress", action="store_true", help="no progress display (log lines only)")
    parser.add_argument("--ray", action="store_true",
                        help="run the rollouts on workers in a local Ray that the command starts (loopback only, "
                             "no dashboard, no usage stats) and stops; without --distributed.num_rollout_workers, "
                             "one worker per CPU Ray sees that no engine takes (printed)")
    parser.add_argument("--ray-address", default=None,
                        help="run the rollout workers on the Ray cluster at this address (host:port, or auto); "
                             "the worker count defaults as with --ray, from the cluster's CPUs")
    defaults = preset("main")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, tp, _, doc in iter_fields():
        section = name.rsplit(".", 1)[0] if "." in name else "run"
        if section not in groups:
            groups[section] = parser.add_argument_group(f"{section} options")
        _add_field(groups[section], name, tp, _lookup(defaults, name), doc)
    track_given(parser)


TRAIN_OPTIONS = {
    **{dest: Applies("always") for dest in ("out", "resume", "no_progress", "ray", "ray_address")},
    "preset": Applies("without --config and --resume (they give the whole configuration)",
                      lambda a: not a.config and not a.resume,
                      lambda a: "got --resume" if a.resume else f"got --config {a.config}"),
    **{dest: Applies("without --resume (the run's stored config is used)", lambda a: not a.resume,
                     lambda a: "got --resume") for dest in ("algo", "config")},
}
"""Where each of ``train``'s own options applies (the context is the parsed options). Every
``--<section>.<field>`` option (dest ``cfg:<field>``) overrides its field of the configuration;
with ``--resume`` only ``--rl.iterations`` may be given (:func:`run` refuses the others)."""
CONFIG_FIELDS = "cfg:"


def _add_field(group, name: str, tp: Any, default: Any, doc: str) -> None:
    kwargs: dict[str, Any] = dict(dest=f"cfg:{name}", default=argparse.SUPPRESS,
                                  help=f"{doc} (main preset: {default!r})".replace("%", "%%"))
    if tp is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(tp) is typing.Literal:
        kwargs["choices"] = typing.get_args(tp)
    else:
        kwargs["type"], kwargs["metavar"] = _parser_of(tp)
    group.add_argument(f"--{name}", **kwargs)


def _parser_of(tp: Any) -> tuple[Any, str]:
    """``(type callable, metavar)`` for a field type: a scalar, ``X | None`` (``none``), or a union
    of a scalar and a ``Literal`` (``float | Literal["adaptive"]``)."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return tp, tp.__name__.upper()
    args = typing.get_args(tp)
    words = [a for arg in args if typing.get_origin(arg) is typing.Literal for a in typing.get_args(arg)]
    words += ["none"] if type(None) in args else []
    (scalar,) = [a for a in args if a is not type(None) and typing.get_origin(a) is not typing.Literal]

    def parse(text: str):
        if text in words:
            return None if text == "none" else text
        try:
            return scalar(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {scalar.__name__} or one of {words}, got {text!r}") from None

    parse.__name__ = scalar.__name__  # argparse names the type in its message
    return parse, "|".join([scalar.__name__.upper(), *words])


def _lookup(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The preset (or ``--config``) with the command line's overrides applied and validated."""
    cfg, changes = _base_config(args), _changes(args)
    changes.update({name: value for name, (value, _) in implied_options(cfg, changes).items()})
    if _auto_workers(args, cfg, changes):
        # a placeholder that validates (engines need a worker); the count is chosen once Ray is up
        changes[WORKERS] = 1
    return override(cfg, changes) if changes else cfg


def _base_config(args: argparse.Namespace) -> TrainConfig:
    if args.config:
        return TrainConfig.from_dict(__import__("json").loads(Path(args.config).read_text()))
    return preset(args.preset)


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    changes = {k.split(":", 1)[1]: v for k, v in vars(args).items() if k.startswith("cfg:")}
    if args.algo:
        changes["rl.algo"] = args.algo
    return changes


def implied_options(cfg: TrainConfig, changes: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """Options that a given option needs and that the command line left at a value that cannot work
    with it: ``{option: (the value picked, why)}``. Giving the option keeps the user's value."""
    picked: dict[str, tuple[Any, str]] = {}
    if (changes.get("rollout.source", cfg.rollout.source) == "mini_swe_agent" and "env.backend" not in changes
            and cfg.env.backend == "sim"):
        picked["env.backend"] = ("local", "rollout.source=mini_swe_agent runs the agent's commands in a real sandbox")
    return picked


def _say_implied(args: argparse.Namespace) -> None:
    for name, (value, why) in implied_options(_base_config(args), _changes(args)).items():
        print(f"compactrl train: {name}={value} ({why}; set --{name} to choose)", flush=True)  # noqa: T201


WORKERS = "distributed.num_rollout_workers"


def _wants_ray(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "ray", False) or getattr(args, "ray_address", None))


def _auto_workers(args: argparse.Namespace, cfg: TrainConfig, changes: dict[str, Any]) -> bool:
    """``--ray``/``--ray-address`` given, the worker count not: :func:`choose_workers` picks it."""
    return (_wants_ray(args) and not getattr(args, "resume", False) and WORKERS not in changes
            and cfg.distributed.num_rollout_workers == 0
            and changes.get("rollout.source", cfg.rollout.source) != "mini_swe_agent")  # refused: no workers


def choose_workers(cpus: float, engines: int) -> int:
    """Rollout workers for a Ray with ``cpus`` CPUs: one per CPU that no engine reserves (each worker
    and each engine reserves one CPU, so more would wait for a CPU that never frees)."""
    workers = int(cpus) - engines
    if workers < 1:
        raise ValueError(f"{WORKERS}: Ray sees {cpus:g} CPU(s) and distributed.num_engines={engines} reserves "
                         f"{engines}: no CPU is left for a rollout worker; lower the engines or add CPUs")
    return workers


def _with_chosen_workers(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with one rollout worker per free CPU of the Ray this process is connected to, said on stdout."""
    import ray

    cpus = ray.cluster_resources().get("CPU", 0.0)
    workers = choose_workers(cpus, cfg.distributed.num_engines)
    engines = cfg.distributed.num_engines
    print(f"compactrl train: {WORKERS}={workers} (Ray sees {cpus:g} CPU(s)"  # noqa: T201 - CLI output
          f"{f', {engines} taken by engines' if engines else ''}; set --{WORKERS} to choose)", flush=True)
    log.info("%s=%d chosen from %g CPU(s), %d engine(s)", WORKERS, workers, cpus, engines)
    return override(cfg, {WORKERS: workers})


def _resolve_out(args: argparse.Namespace, cfg: TrainConfig) -> Path:
    if args.out:
        return Path(args.out)
    if args.resume:
        runs = sorted((p for p in RUNS_ROOT.glob("*") if (p / "config.json").exists()),
                      key=lambda p: p.stat().st_mtime)
        if not runs:
            raise ValueError(f"--resume: no run with a config.json under {RUNS_ROOT}/; pass --out")
        return runs[-1]
    return RUNS_ROOT / f"{args.preset}-{cfg.rl.algo}-{time.strftime('%Y%m%d-%H%M%S')}"


RESUME_CHANGES = {"rl.iterations", "learner.ranks", "learner.launcher"}
"""Options a resumed run takes beside its stored config: more iterations, another learner rank count."""


def run(args: argparse.Namespace) -> int:
    from compactrl.training.ranks import under_torchrun
    from compactrl.training.trainer import train

    if under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1 and int(os.environ["RANK"]) > 0:
        return _follow_rank_zero()
    try:
        refuse_ignored(args, TRAIN_OPTIONS, args)
        cfg = config_from_args(args)
        out = _resolve_out(args, cfg)
        given = [k.split(":", 1)[1] for k in vars(args) if k.startswith("cfg:")]
        auto_workers = _auto_workers(args, _base_config(args), _changes(args))
        if not args.resume:
            _say_implied(args)
        if not args.resume:  # a resumed run checks its stored config when its collector starts
            _check_ray_args(args, cfg)
        if args.resume and set(given) - RESUME_CHANGES:
            raise ValueError("--resume uses the run's stored config (only --rl.iterations may change, to extend "
                             "the run, and --learner.ranks / --learner.launcher, to resume at another rank count); "
                             f"drop {sorted(set(given) - RESUME_CHANGES)}")
        _check_torchrun(args, cfg)
    except ValueError as exc:
        print(f"compactrl train: error: {exc}")  # noqa: T201 - CLI output, one line
        return 2
    progress = None if args.no_progress else (_rich_progress() if sys.stdout.isatty() else TextProgress())
    try:
        extend = cfg.rl.iterations if args.resume and "cfg:rl.iterations" in vars(args) else None
        learner = {k: _lookup(cfg, k) for k in ("learner.ranks", "learner.launcher") if f"cfg:{k}" in vars(args)}
        with _ray(args, cfg):
            if auto_workers:
                cfg = _with_chosen_workers(cfg)
            result = train(cfg, out, resume=args.resume, progress=progress, iterations=extend,
                           learner=learner if args.resume else None)
    except ValueError as exc:  # the run directory does not fit the request (exists, or already longer)
        log.debug("train failed", exc_info=True)
        print(f"compactrl train: error: {exc}")  # noqa: T201 - CLI output
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted; continue with: compactrl train --resume --out {out}")  # noqa: T201
        return 130
    except RuntimeError as exc:
        from compactrl.serving.vllm.client import EngineFailure
        from compactrl.training.ranks import LearnerRankError

        if not isinstance(exc, (EngineFailure, LearnerRankError)):
            raise
        log.debug("the vLLM engine or a learner rank failed", exc_info=True)
        print(f"compactrl train: error: {exc}\ncontinue from the last checkpoint with: "  # noqa: T201
              f"compactrl train --resume --out {out}")
        return 1
    finally:
        if progress is not None:
            progress.stop()
    print(result.summary_line())  # noqa: T201 - CLI output
    print(f"run directory: {out}  (report: {out / 'report.md'})")  # noqa: T201
    return 0


def _check_torchrun(args: argparse.Namespace, cfg: TrainConfig) -> None:
    """Under ``torchrun`` with several processes, rank 0 trains with them as its learner ranks: the rank count
    must be the world size (the other ranks have already gone to :func:`_follow_rank_zero`)."""
    from compactrl.training.ranks import under_torchrun

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if under_torchrun() and world > 1 and (cfg.learner.ranks != world or cfg.learner.launcher == "ray"):
        raise ValueError(f"learner.ranks: under torchrun with {world} processes, expected --learner.ranks {world} "
                         f"(and learner.launcher auto or torchrun), got {cfg.learner.ranks} ({cfg.learner.launcher})")


def _follow_rank_zero() -> int:
    """A ``torchrun`` rank other than 0: serve rank 0's learner calls until it closes the learner."""
    from compactrl.training.ranks import follow

    log.info("learner rank %s of %s: following rank 0", os.environ["RANK"], os.environ["WORLD_SIZE"])
    follow()
    return 0


def _check_ray_args(args: argparse.Namespace, cfg: TrainConfig) -> None:
    if args.ray and args.ray_address:
        raise ValueError("--ray starts a local Ray, --ray-address joins a cluster: give one of them")
    if _wants_ray(args) and cfg.rollout.source == "mini_swe_agent":
        raise ValueError("--ray: rollout.source=mini_swe_agent runs its episodes in the trainer's process, "
                         "behind its in-process gateway; drop --ray")


def _ray(args: argparse.Namespace, cfg: TrainConfig):
    """The run's Ray (started here and stopped at the end, or joined), or nothing.

    Rollout workers without ``--ray``/``--ray-address`` get a local Ray, as ``--ray`` would start
    (said on stdout): asking for workers is asking for a Ray."""
    import contextlib

    workers = cfg.distributed.num_rollout_workers
    if not _wants_ray(args) and not (workers and not args.resume):
        return contextlib.nullcontext()
    from compactrl.distributed import ray_for_run

    if not _wants_ray(args):
        print(f"compactrl train: {WORKERS}={workers}: starting a local Ray for them "  # noqa: T201 - CLI output
              "(as --ray does; --ray-address joins a cluster)", flush=True)
    return ray_for_run(args.ray_address or "")


class TextProgress:
    """Progress as plain-text lines when the output is not a terminal (a log file, a pipe).

    Rich's live bars written to a file appear only at the end; these lines appear as the run goes:
    ``12:03:41  SFT  120/300  4m10s elapsed  ETA 6m15s  nll 1.234``: a phase's first step, then at
    most one line per phase every ``every_s`` seconds, and always its last step. Same interface as rich's ``Progress``
    (``add_task``, ``update``, ``stop``).
    """

    def __init__(self, every_s: float = 15.0, stream=None) -> None:
        self.every_s, self.stream = every_s, stream
        self.tasks: list[dict[str, Any]] = []

    def add_task(self, description: str, total: int, completed: int = 0, status: str = "") -> int:
        now = time.monotonic()
        self.tasks.append(dict(name=description, total=total, done=completed, start=now, shown=now,
                               first=completed))
        return len(self.tasks) - 1

    def update(self, task: int, advance: int = 1, status: str = "") -> None:
        t = self.tasks[task]
        t["done"] += advance
        now = time.monotonic()
        first = t["done"] - advance <= t["first"]  # a phase's first step says that it has started
        if now - t["shown"] < self.every_s and t["done"] < t["total"] and not first:
            return
        t["shown"] = now
        self._line(t, now, status)

    def _line(self, t: dict[str, Any], now: float, status: str) -> None:
        elapsed, rate_steps = now - t["start"], t["done"] - t["first"]
        eta = elapsed / rate_steps * (t["total"] - t["done"]) if rate_steps > 0 else float("nan")
        print(f"{time.strftime('%H:%M:%S')}  {t['name']}  {t['done']}/{t['total']}  {_duration(elapsed)} elapsed  "  # noqa: T201
              f"ETA {_duration(eta)}  {status}".rstrip(), file=self.stream or sys.stdout, flush=True)

    def stop(self) -> None:
        pass


def _duration(seconds: float) -> str:
    if seconds != seconds:  # nan: no step yet
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _rich_progress():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
    )
    progress.start()
    return progress
