"""Run a policy on a task set (SWE-bench rows, Terminal-Bench folders, Task records) on a real
backend: ``compactrl eval --tasks PATH --backend local|docker --policy gold|noop|...``.

Each task runs once in a bare env (no context budget: reference solutions are long), so this is
how a task set is validated before training on it: ``gold`` must succeed and ``noop`` fail on
every task. The result holds one record per task and an ``overall`` summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from compactrl.envs.sandbox.base import SandboxError
from compactrl.envs.task import Task
from compactrl.types import Policy, PolicyRequest

log = logging.getLogger(__name__)

TASK_SET_TOOLS = ("view", "search", "replace", "create", "shell", "submit")
"""No ``test`` tool: grading writes the hidden tests, which must stay unseen until the end."""


def make_env(task: Task, backend: str, sandbox_kwargs: dict[str, Any] | None = None, max_turns: int | None = None):
    """The bare env for one task: ``TerminalEnv`` for terminal tasks, ``CodeRepoEnv`` otherwise."""
    kwargs = dict(backend=backend, sandbox_kwargs=sandbox_kwargs, max_turns=max_turns)
    if task.kind == "terminal":
        from compactrl.envs.terminal_env import TerminalEnv

        return TerminalEnv(task, **kwargs)
    from compactrl.envs.code_env import CodeRepoEnv

    return CodeRepoEnv(task, tools=TASK_SET_TOOLS, **kwargs)


def run_task(task: Task, policy: Policy, backend: str, *, sandbox_kwargs: dict[str, Any] | None = None,
             max_turns: int | None = None) -> dict[str, Any]:
    """One episode of ``task``; infrastructure failures are recorded, not raised."""
    record: dict[str, Any] = {"task_id": task.id, "source": task.source, "kind": task.kind, "success": False,
                              "reward": 0.0, "turns": 0, "terminated": False, "truncated": False}
    started = time.perf_counter()
    env = None
    try:
        env = make_env(task, backend, sandbox_kwargs, max_turns)
        obs, info = env.reset(options={"task": task})
        messages = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs}]
        limit = (max_turns or task.max_turns) + 1
        for _ in range(limit):
            action = policy.act([PolicyRequest(messages=list(messages), task=task)])[0]
            obs, reward, terminated, truncated, info = env.step(action)
            messages += [{"role": "assistant", "content": str(action)}, {"role": "tool", "content": obs}]
            record["turns"] += 1
            record["reward"] += float(reward)
            if terminated or truncated:
                record.update(terminated=terminated, truncated=truncated, success=bool(info.get("success")),
                              test_summary=info.get("test_summary", ""))
                if "sandbox_error" in info:
                    record["error"] = info["sandbox_error"]
                break
    except (SandboxError, ValueError, OSError) as exc:
        log.warning("task %s failed to run: %s", task.id, exc)
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if env is not None:
            env.close()
    record["wall_s"] = round(time.perf_counter() - started, 3)
    return record


def evaluate_tasks(tasks: list[Task], policy: Policy, backend: str, **kwargs: Any) -> dict[str, Any]:
    """Every task once; ``{"tasks": [records], "overall": {...}}``."""
    records = [run_task(t, policy, backend, **kwargs) for t in tasks]
    n = len(records)
    overall = {
        "tasks": n,
        "success_rate": sum(r["success"] for r in records) / n if n else 0.0,
        "succeeded": sum(1 for r in records if r["success"]),
        "errors": sum(1 for r in records if "error" in r),
        "mean_turns": sum(r["turns"] for r in records) / n if n else 0.0,
    }
    return {"tasks": records, "overall": overall}


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("task sets (--tasks)")
    g.add_argument("--tasks", default=None, help="SWE-bench .json/.jsonl, Task records, or Terminal-Bench folder(s)")
    g.add_argument("--backend", default="local", choices=("sim", "local", "docker"), help="sandbox (default: local)")
    g.add_argument("--repos-root", default=None, help="SWE-bench: folder of checkouts named <owner>__<name>")
    g.add_argument("--swebench-images", action="store_true", help="SWE-bench: use the sweb.eval.* instance images")
    g.add_argument("--image-namespace", default="swebench", help="SWE-bench image namespace ('' for local builds)")
    g.add_argument("--python", default=None, help="interpreter that runs the tests inside the sandbox")
    g.add_argument("--instance-ids", default=None, help="SWE-bench: comma-separated instance ids to load")
    g.add_argument("--setup", action="append", default=[], help="setup command run before the agent (repeatable)")
    g.add_argument("--image", default=None, help="Terminal-Bench/docker: image for every task")
    g.add_argument("--sandbox-kwargs", default="{}", help="JSON options of the sandbox backend")
    g.add_argument("--max-turns", type=int, default=None, help="turn limit (default: each task's)")


def run_tasks(args: argparse.Namespace) -> int:
    from compactrl.envs.loaders import load_tasks
    from compactrl.envs.loaders.swebench import SWEBenchConfig
    from compactrl.envs.loaders.terminal_bench import TerminalBenchConfig

    try:
        sandbox_kwargs = json.loads(args.sandbox_kwargs)
        swe = None
        if args.repos_root or args.swebench_images:
            swe = SWEBenchConfig(repos_root=args.repos_root, use_images=args.swebench_images,
                                 image_namespace=args.image_namespace or None, python=args.python,
                                 setup=tuple(args.setup))
        tb = TerminalBenchConfig(python=args.python or "python3", image=args.image)
        ids = [i for i in (args.instance_ids or "").split(",") if i] or None
        tasks = load_tasks(args.tasks, swebench=swe, terminal_bench=tb, instance_ids=ids)
    except (ValueError, OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"--tasks: {exc}") from None
    if not isinstance(sandbox_kwargs, dict):
        raise SystemExit(f"--sandbox-kwargs: expected a JSON object, got {args.sandbox_kwargs!r}")
    from compactrl.evaluation import make_policy

    policy = make_policy(args.policy, seed=args.seed, summary_quality=args.summary_quality)
    result = evaluate_tasks(tasks, policy, args.backend, sandbox_kwargs=sandbox_kwargs, max_turns=args.max_turns)
    result["overall"].update(policy=args.policy, backend=args.backend, source=args.tasks)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for r in result["tasks"]:
            status = "ok  " if r["success"] else "FAIL"
            print(f"{status} {r['task_id']}  turns={r['turns']}" + (f"  error={r['error']}" if "error" in r else ""))
        o = result["overall"]
        print(f"{o['succeeded']}/{o['tasks']} succeeded ({o['errors']} errors), policy={o['policy']}, backend={o['backend']}")
    return 0
