"""Evaluation of any policy (scripted, a saved model, a server URL) on generated-task envs or task
sets, as a thin layer over :class:`~compactrl.collectors.TraceCollector` (see ``docs/evaluation.md``)."""

from compactrl.eval.episodes import evaluate, evaluate_policy, open_budget, with_budget
from compactrl.eval.policies import SCRIPTED, PolicySpec, make_policy
from compactrl.eval.tasks import evaluate_tasks, run_task

__all__ = ["SCRIPTED", "PolicySpec", "evaluate", "evaluate_policy", "evaluate_tasks", "make_policy", "open_budget",
           "run_task", "with_budget"]
