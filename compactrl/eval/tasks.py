"""Evaluation on a task set (SWE-bench rows, Terminal-Bench folders, Task records) through the collector.

Every task runs once, on the ``sim``, ``local`` or ``docker`` backend, as an episode of a
:class:`~compactrl.collectors.TraceCollector` (``collect`` with ``{"task": task}`` reset options),
inside a :class:`~compactrl.wrappers.ContextBudget`. By default that wrapper never asks for a
summary (:func:`~compactrl.eval.episodes.open_budget`: the policy's context window, its response
cap, no compactions), because reference solutions and real repositories are long; give a
``context_budget`` to evaluate a compacting agent on the task set under a budget instead.

This is also how a task set is validated before training on it: ``gold`` must succeed and
``noop`` fail on every task. Infrastructure failures (a sandbox that does not start, a task the
backend cannot run, a task that does not fit the budget) are per-task records with
``sandbox_error`` set, never exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compactrl.collectors import EpisodeStats, TraceCollector, summarize_episodes
from compactrl.eval.episodes import with_budget
from compactrl.eval.records import with_encoded_output
from compactrl.task import Task
from compactrl.wrappers import ContextBudgetConfig

TASK_SET_TOOLS = ("view", "search", "replace", "create", "shell", "submit")
"""No ``test`` tool: grading writes the hidden tests, which must stay unseen until the end."""

BACKENDS = ("sim", "local", "docker")


def make_env(kind: str, tasks: Sequence[Task], backend: str, *, sandbox_kwargs: dict[str, Any] | None = None,
             max_turns: int | None = None):
    """The bare env for tasks of one kind: ``TerminalEnv`` for ``terminal``, ``CodeRepoEnv`` otherwise."""
    kwargs = dict(backend=backend, sandbox_kwargs=sandbox_kwargs, max_turns=max_turns)
    if kind == "terminal":
        from compactrl.envs.terminal_env import TerminalEnv

        return TerminalEnv(list(tasks), **kwargs)
    from compactrl.envs.code_env import CodeRepoEnv

    return CodeRepoEnv(list(tasks), tools=TASK_SET_TOOLS, **kwargs)


def evaluate_tasks(
    tasks: Sequence[Task],
    policy,
    backend: str,
    *,
    sandbox_kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    num_envs: int = 1,
    context_budget: ContextBudgetConfig | None = None,
    seed: int = 0,
    give_task_to_policy: bool = True,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Every task once; returns (aggregates, one record per task in input order).

    A record is the episode's :class:`~compactrl.collectors.EpisodeStats` (``task_id``,
    ``success``, ``num_traces``, ``sandbox_error``, the final ``info`` with ``test_summary``...)
    plus the task's ``source`` and ``kind``. The aggregates are
    :func:`~compactrl.collectors.summarize_episodes` of all tasks. ``num_envs`` sandboxes run at
    once (each an episode's container or bubblewrap jail). ``give_task_to_policy``: the scripted
    policies (``gold`` reads the reference solution) need the task; learned policies must not see it.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if num_envs < 1:
        raise ValueError(f"num_envs: expected >= 1, got {num_envs}")
    stats: dict[int, EpisodeStats] = {}
    for kind in sorted({t.kind for t in tasks}):
        index = [i for i, t in enumerate(tasks) if t.kind == kind]
        kind_tasks = [tasks[i] for i in index]

        def make(kind=kind, kind_tasks=kind_tasks):
            bare = make_env(kind, kind_tasks, backend, sandbox_kwargs=sandbox_kwargs, max_turns=max_turns)
            return with_budget(bare, policy, context_budget)

        collector = TraceCollector([make] * min(num_envs, len(index)), policy, episodes_per_batch=len(index),
                                   seed=seed, give_task_to_policy=give_task_to_policy)
        try:
            collector.collect([{"task": t} for t in kind_tasks])
        finally:
            collector.shutdown()
        stats.update(zip(index, collector.last_episode_stats))
    ordered = [stats[i] for i in range(len(tasks))]
    builds = backend == "docker" and (sandbox_kwargs or {}).get("build_images", True)
    return summarize_episodes(ordered), [_record(i, t, s, builds) for i, (t, s) in enumerate(zip(tasks, ordered))]


def run_task(task: Task, policy, backend: str, **kwargs: Any) -> dict[str, Any]:
    """The record of one task (:func:`evaluate_tasks` of ``[task]``)."""
    return evaluate_tasks([task], policy, backend, **kwargs)[1][0]


def _record(position: int, task: Task, stats: EpisodeStats, builds_images: bool) -> dict[str, Any]:
    record = stats.to_dict()
    # the task's id also when its reset failed; one collector per kind numbers its own episodes
    record.update(episode_id=position, task_id=task.id, source=task.source, kind=task.kind)
    # the whole test log, compressed when large: a record can be graded again (compactrl.eval.records)
    record["info"] = with_encoded_output(record.get("info") or {})
    # what the backend could not honour (Terminal-Bench: image-only steps, a grading fallback); the
    # docker backend builds a task's own image, which runs those steps itself
    built = builds_images and task.runtime.image_build is not None and not task.docker_image
    local = (*task.grading.image_only, *task.grading.local_notes)
    notes = [*(() if built else local), *filter(None, [task.grading.note])]
    if notes:
        record["task_notes"] = notes
    return record
