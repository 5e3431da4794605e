"""``compactrl eval``: evaluate a policy on a generated-task env or on a task set (``--tasks``).

``--policy`` is a scripted policy (oracle, random, gold, noop), a saved model directory or the URL
of an OpenAI-compatible server. The summary (the names of
:func:`~compactrl.collectors.summarize_episodes`, as in the trainer's ``eval/`` metrics) is printed
as a table, or with ``--json`` as one JSON object that also holds every episode's record;
``--out FILE`` writes one JSON line per episode (task).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from compactrl.cli_options import Applies, given, refuse_ignored, track_given
from compactrl.eval.policies import SCRIPTED, PolicySpec, make_policy
from compactrl.tasksets import task_kind


def _difficulties() -> tuple[str, ...]:
    from compactrl.tasksets.generators.code import PRESETS as CODE
    from compactrl.tasksets.generators.terminal import PRESETS as TERMINAL

    return tuple(dict.fromkeys([*CODE, *TERMINAL]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from compactrl.tasksets.generators.code import SPLITS

    parser.add_argument("--env", default="CompactCode-v0", help="registered env id (default: CompactCode-v0)")
    parser.add_argument("--policy", default="oracle", metavar="{" + ",".join(SCRIPTED) + ",PATH,URL}",
                        help="scripted policy (gold: the reference solution; noop: submit at once), a saved model "
                             "directory (a run's final_model/ or sft_model/), or an OpenAI-compatible server URL")
    parser.add_argument("--episodes", type=int, default=20, help="number of episodes (default: 20)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the task-seed stream (the trainer's eval.seed gives its held-out tasks)")
    parser.add_argument("--env-kwargs", default="{}", help='JSON keyword arguments of the env, e.g. \'{"budget": 4096}\'')
    parser.add_argument("--split", default=None, choices=SPLITS, help="task split (default: the env's)")
    parser.add_argument("--difficulty", default=None, choices=_difficulties(),
                        help="task difficulty preset (each env has its own; default: the env's)")
    parser.add_argument("--summary-quality", type=float, default=1.0, help="oracle: probability a fact survives a summary")
    parser.add_argument("--temperature", type=float, default=0.0, help="model/server sampling temperature (default: 0, greedy)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="model/server response cap (default: 512)")
    parser.add_argument("--tokenizer", default=None, help="model/server tokenizer directory (default: the model's, else compactrl's)")
    parser.add_argument("--served-model", default=None, help="server: model name (default: the first of /v1/models)")
    parser.add_argument("--num-envs", type=int, default=1, help="envs stepped together (one batched policy call per round)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (config, summary, episodes)")
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="write one JSON line per episode (task) to FILE (with the test run's output)")
    parser.add_argument("--expect", default=None, choices=("success", "failure"),
                        help="exit 1 unless every episode (task) ends this way, e.g. gold: success, noop: failure")
    _add_task_arguments(parser)
    track_given(parser)


def _add_task_arguments(parser: argparse.ArgumentParser) -> None:
    from compactrl.eval.tasks import BACKENDS

    g = parser.add_argument_group("task sets (--tasks)")
    g.add_argument("--tasks", default=None, help="SWE-bench .json/.jsonl, Task records, or Terminal-Bench folder(s)")
    g.add_argument("--backend", default="local", choices=BACKENDS,
                   help="sandbox (default: local; on the generated env, the env's: sim)")
    g.add_argument("--repos-root", default=None, help="SWE-bench: folder of checkouts named <owner>__<name>")
    g.add_argument("--swebench-images", action="store_true", help="SWE-bench: use the sweb.eval.* instance images")
    g.add_argument("--image-namespace", default="swebench", help="SWE-bench image namespace ('' for local builds)")
    g.add_argument("--python", default=None, help="interpreter that runs the tests inside the sandbox")
    g.add_argument("--instance-ids", default=None, help="SWE-bench: comma-separated instance ids to load")
    g.add_argument("--swebench-specs", default=None,
                   help="SWE-bench: JSON/YAML file of per-repository (owner/name, owner/name@version) or per-instance "
                        "python, setup, test_command, log_parser, generated_files, checkout (`compactrl tasks prepare` "
                        "writes one: its specs.json)")
    g.add_argument("--setup", action="append", default=[], help="setup command run before the agent (repeatable)")
    g.add_argument("--image", default=None, help="Terminal-Bench/docker: image for every task")
    g.add_argument("--tb-grading", default="auto", choices=("auto", "script", "pytest"),
                   help="Terminal-Bench: grade with the task's run-tests.sh/test.sh (script), pytest on its tests, "
                        "or the script unless it installs from the network (auto, the default)")
    g.add_argument("--sandbox-kwargs", default="{}", help="JSON options of the sandbox backend")
    g.add_argument("--max-turns", type=int, default=None, help="turn limit (default: each task's; the env's)")
    g.add_argument("--budget", type=int, default=None,
                   help="context budget with forced summaries (reserve: --max-new-tokens; default: with --tasks "
                        "an open budget that never asks for a summary, on the generated env the env's)")
    g.add_argument("--max-compactions", type=int, default=8,
                   help="with --budget, or on the generated env: summaries per episode (default: 8; the env's)")


KINDS = {"swebench": "SWE-bench rows", "terminal-bench": "Terminal-Bench tasks", "records": "Task records"}


@dataclass(frozen=True)
class Context:
    """What decides whether an option of ``eval`` / ``tasks validate`` applies."""

    tasks: str | None
    """``--tasks`` (validate: the source), or None for the generated env."""
    kind: str | None
    """:func:`~compactrl.tasksets.task_kind` of ``tasks``."""
    policy: str = "gold"
    policy_kind: str = "scripted"
    """:attr:`PolicySpec.kind`."""
    backend: str = "local"
    budget: bool = False
    images: bool = False
    """``--swebench-images``."""

    def is_kind(self, *kinds: str) -> bool:
        """The tasks are of one of ``kinds``, or of a kind not known before loading (the loader says why)."""
        return self.kind is None or self.kind in kinds


def _no_tasks(c: Context) -> str:
    return f"got --tasks {c.tasks}"


def _holds(c: Context) -> str:
    return f"{c.tasks} holds {KINDS.get(c.kind or '', c.kind)}" if c.tasks else "no --tasks given"


def _on(*kinds: str, when: str, more=lambda c: True, got=_holds) -> Applies:
    return Applies(when, lambda c: bool(c.tasks) and c.is_kind(*kinds) and more(c), got)


SWEBENCH = "to SWE-bench rows"
TERMINAL_BENCH = "to Terminal-Bench tasks"
TASK_OPTIONS = {
    "instance_ids": Applies("with --tasks", lambda c: bool(c.tasks)),
    "repos_root": _on("swebench", when=SWEBENCH),
    "swebench_images": _on("swebench", when=SWEBENCH),
    "swebench_specs": _on("swebench", when=SWEBENCH),
    "setup": _on("swebench", when=SWEBENCH),
    "image_namespace": _on("swebench", when="with --swebench-images", more=lambda c: c.images,
                           got=lambda c: "without it the rows run in local checkouts"),
    "python": _on("swebench", "terminal-bench", when="to SWE-bench rows and Terminal-Bench tasks"),
    "tb_grading": _on("terminal-bench", when=TERMINAL_BENCH),
    "image": _on("terminal-bench", when="to Terminal-Bench tasks on --backend docker",
                 more=lambda c: c.backend == "docker", got=lambda c: f"{_holds(c)}, --backend {c.backend}"),
}
"""Task-set options that ``eval`` and ``tasks validate`` share."""

MODEL_OR_SERVER = ("model", "url")
EVAL_OPTIONS: dict[str, Applies] = {
    **{dest: Applies("always") for dest in ("policy", "seed", "num_envs", "json", "out", "expect", "tasks",
                                            "backend", "sandbox_kwargs", "max_turns", "budget")},
    **{dest: Applies("to the generated env (without --tasks)", lambda c: not c.tasks, _no_tasks)
       for dest in ("env", "episodes", "env_kwargs", "split", "difficulty")},
    "summary_quality": Applies("with --policy oracle", lambda c: c.policy == "oracle",
                               lambda c: f"got --policy {c.policy}"),
    **{dest: Applies("with a model or server --policy", lambda c: c.policy_kind in MODEL_OR_SERVER,
                     lambda c: f"got --policy {c.policy}") for dest in ("temperature", "tokenizer")},
    "max_new_tokens": Applies("with a model or server --policy, or with --budget (its reserve)",
                              lambda c: c.policy_kind in MODEL_OR_SERVER or c.budget,
                              lambda c: f"got --policy {c.policy}"),
    "served_model": Applies("with a server --policy (an http(s):// URL)", lambda c: c.policy_kind == "url",
                            lambda c: f"got --policy {c.policy}"),
    "max_compactions": Applies("with --budget, or on the generated env", lambda c: c.budget or not c.tasks,
                               lambda c: "an open budget never asks for a summary"),
    **TASK_OPTIONS,
}
"""Where each option of ``compactrl eval`` applies; one given where it does not is refused."""

ENV_KWARGS = ("split", "difficulty", "max_turns", "backend", "sandbox_kwargs", "budget", "max_compactions")
"""Options that become the generated env's keyword arguments of the same names."""
UNSET_BY_DEFAULT = ("split", "difficulty", "max_turns", "budget")


def eval_context(args: argparse.Namespace, spec: PolicySpec) -> Context:
    return Context(tasks=args.tasks, kind=task_kind(args.tasks), policy=args.policy, policy_kind=spec.kind,
                   backend=args.backend, budget=args.budget is not None, images=args.swebench_images)


def run(args: argparse.Namespace) -> int:
    """Raises ``ValueError`` naming the option for a bad value, or for one that would be ignored
    (the CLI prints it as one line)."""
    if args.episodes < 1:
        raise ValueError(f"--episodes: expected >= 1, got {args.episodes}")
    if args.num_envs < 1:
        raise ValueError(f"--num-envs: expected >= 1, got {args.num_envs}")
    try:
        spec = PolicySpec(name=args.policy, seed=args.seed, temperature=args.temperature,
                          max_new_tokens=args.max_new_tokens, summary_quality=args.summary_quality,
                          tokenizer=args.tokenizer, served_model=args.served_model)
    except ValueError as exc:  # its fields are the options of the same names
        field, _, rest = str(exc).partition(": ")
        raise ValueError(f"--{field.replace('_', '-')}: {rest}") from None
    refuse_ignored(args, EVAL_OPTIONS, eval_context(args, spec))
    started = time.perf_counter()
    if args.tasks:
        config, summary, records = _run_tasks(args, spec)
    else:
        config, summary, records = _run_env(args, spec)
    config["wall_s"] = round(time.perf_counter() - started, 3)
    if args.out:
        write_jsonl(args.out, records)
    if args.json:
        print(json.dumps({"config": config, "summary": summary, "episodes": records}, sort_keys=True))
    else:
        print(format_table(config, summary, records if args.tasks else []))
        if args.tasks:
            tails = failed_tails(records)
            if tails:
                print(tails)
    return expectation_status(records, args.expect)


def expectation_status(records: list[dict[str, Any]], expect: str | None) -> int:
    """1 when ``expect`` (``success``/``failure``) is set and some episode ended otherwise (a task
    that could not be graded meets neither), else 0."""
    if expect is None:
        return 0
    want = expect == "success"
    wrong = [r for r in records if r.get("not_gradable") or bool(r.get("success")) != want]
    return 1 if wrong else 0


def failed_tails(records: list[dict[str, Any]]) -> str:
    """For every failed episode, the tail of its test log (or why it was not graded / its sandbox
    error): a test that never ran must not look like a test that failed."""
    parts = []
    for r in records:
        if r.get("success"):
            continue
        info = r.get("info") or {}
        body = r.get("not_gradable") or r.get("sandbox_error") or info.get("test_log_tail") or "(no test output)"
        parts.append(f"--- {r['task_id']}: last lines of the test log ---\n{body}")
    return "\n".join(parts)


def _json_object(option: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option}: expected a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{option}: expected a JSON object, got {text!r}")
    return value


def _run_env(args: argparse.Namespace, spec: PolicySpec):
    from compactrl.eval.episodes import evaluate

    env_kwargs = _json_object("--env-kwargs", args.env_kwargs)
    for name in ENV_KWARGS:
        if name in given(args) or (name in UNSET_BY_DEFAULT and getattr(args, name) is not None):
            option = "--" + name.replace("_", "-")
            if name in env_kwargs:
                raise ValueError(f"{option}: also given in --env-kwargs ({name}={env_kwargs[name]!r}); give it once")
            value = getattr(args, name)
            env_kwargs[name] = _json_object(option, value) if name == "sandbox_kwargs" else value
    if args.budget is not None:
        _task_budget(args)  # the same checks and message as with --tasks
        env_kwargs.setdefault("reserve", args.max_new_tokens)
    policy = make_policy(spec)
    summary, stats = evaluate(args.env, policy, episodes=args.episodes, seed=args.seed, env_kwargs=env_kwargs,
                              num_envs=args.num_envs, give_task_to_policy=spec.kind == "scripted")
    config = dict(env=args.env, policy=args.policy, seed=args.seed, env_kwargs=env_kwargs)
    return config, summary, [s.to_dict() for s in stats]


def _run_tasks(args: argparse.Namespace, spec: PolicySpec):
    from compactrl.eval.tasks import evaluate_tasks

    sandbox_kwargs = _json_object("--sandbox-kwargs", args.sandbox_kwargs)
    budget = _task_budget(args)
    tasks = _load_tasks(args)
    # a task its loader flagged is reported with the reason, never run nor graded
    gradable = [t for t in tasks if not t.grading.not_gradable]
    summary, done = evaluate_tasks(gradable, make_policy(spec), args.backend, sandbox_kwargs=sandbox_kwargs,
                                   max_turns=args.max_turns, num_envs=args.num_envs, seed=args.seed,
                                   context_budget=budget, give_task_to_policy=spec.kind == "scripted") if gradable \
        else ({}, [])
    by_id = iter(done)
    records = [next(by_id) if not t.grading.not_gradable else
               {"task_id": t.id, "source": t.source, "kind": t.kind, "success": False,
                "not_gradable": str(t.grading.not_gradable), "info": {}} for t in tasks]
    if len(gradable) < len(tasks):
        summary = {**summary, "not_gradable": float(len(tasks) - len(gradable))}
    config = dict(tasks=args.tasks, policy=args.policy, backend=args.backend, seed=args.seed, budget=args.budget)
    return config, summary, records


def _task_budget(args: argparse.Namespace):
    """``--budget``'s ContextBudget config (None: the open budget of ``evaluate_tasks``)."""
    from compactrl.wrappers import ContextBudgetConfig

    if args.budget is None:
        return None
    try:
        return ContextBudgetConfig(budget=args.budget, reserve=args.max_new_tokens, max_compactions=args.max_compactions)
    except ValueError as exc:
        raise ValueError(f"--budget/--max-new-tokens/--max-compactions: {exc}") from None


def _load_tasks(args: argparse.Namespace):
    from compactrl.tasksets import load_tasks
    from compactrl.tasksets.swebench.rows import SWEBenchConfig, load_specs
    from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig

    try:
        swe = None
        if args.repos_root or args.swebench_images:
            specs = load_specs(args.swebench_specs) if args.swebench_specs else {}
            swe = SWEBenchConfig(repos_root=args.repos_root, use_images=args.swebench_images,
                                 image_namespace=args.image_namespace or None, python=args.python,
                                 setup=tuple(args.setup), specs=specs)
        # on the local backend the Dockerfiles' steps are replayed now (cached), before any episode
        tb = TerminalBenchConfig(python=args.python or "python3", image=args.image, grading=args.tb_grading,
                                 backend=args.backend, prepare=args.backend == "local")
        ids = [i for i in (args.instance_ids or "").split(",") if i] or None
        if ids is None or task_kind(args.tasks) == "swebench":
            return load_tasks(args.tasks, swebench=swe, terminal_bench=tb, instance_ids=ids)
    except (ValueError, OSError) as exc:
        raise ValueError(f"--tasks: {exc}") from None
    return _load_ids(args.tasks, ids, lambda path: load_tasks(path, swebench=swe, terminal_bench=tb))


def _load_ids(path: str, ids: list[str], load) -> list:
    """``--instance-ids`` of Terminal-Bench tasks (folder names: only those folders are loaded, and
    prepared) or of Task records, in the order given."""
    from compactrl.tasksets.terminal_bench.folders import is_task_dir

    try:
        if os.path.isdir(path) and not is_task_dir(path):
            missing = [i for i in ids if not os.path.isdir(os.path.join(path, i))]
            by_id = {} if missing else {t.id: t for i in ids for t in load(os.path.join(path, i))}
        else:
            by_id = {t.id: t for t in load(path)}
            missing = [i for i in ids if i not in by_id]
    except (ValueError, OSError) as exc:
        raise ValueError(f"--tasks: {exc}") from None
    if missing:
        raise ValueError(f"--instance-ids: not in {path}: {missing}")
    return [by_id[i] for i in ids]


def write_jsonl(path: str, records: list[dict[str, Any]]) -> None:
    """One JSON line per record, written to a temporary file and renamed (never half-written)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".eval-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w") as f:
            for record in records:
                f.write(json.dumps(record, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def format_table(config: dict[str, Any], summary: dict[str, float], records: list[dict[str, Any]]) -> str:
    """One line per task (task sets), then ``name  value`` rows of the config and the summary."""
    lines = []
    for r in records:
        status = "ok  " if r["success"] else "FAIL"
        if r.get("not_gradable"):
            lines.append(f"SKIP {r['task_id']}  not gradable: {r['not_gradable']}")
            continue
        error = f"  error={r['sandbox_error']}" if r.get("sandbox_error") else ""
        notes = f"  notes={'; '.join(r['task_notes'])}" if r.get("task_notes") else ""
        lines.append(f"{status} {r['task_id']}  steps={r['steps']}  traces={r['num_traces']}{error}{notes}")
    rows = {**{k: v for k, v in config.items() if not isinstance(v, dict)}, **summary}
    width = max(len(k) for k in rows)
    for key, value in rows.items():
        lines.append(f"{key:<{width}}  {value:.4g}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    return "\n".join(lines)
