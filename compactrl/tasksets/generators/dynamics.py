"""How a generated task's test runs behave at run time: flaky runs and per-fact progress rewards.

A task whose generator config sets ``flaky_test_p`` or ``progress_reward`` carries a ``dynamics``
record in its metadata (see :class:`~compactrl.tasksets.generators.code.CodeTaskConfig`). The env
passes every test run through :class:`TaskDynamics`, the same way on every sandbox backend:

- a run flakes with probability ``flaky_test_p``, drawn from the episode's seeded RNG: the flaky
  test is added to the failures and the run does not succeed, whatever the work. The env does not
  accept a submit whose run flaked (the agent must submit again); the grading at a limit is a run
  like any other, so a flake there fails the episode.
- ``progress_reward`` is paid for each fact's spec test the first time a run (that did not flake)
  shows it passing: verified progress, rewarded at the step whose run showed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from compactrl.sandbox import TestReport


@dataclass
class TaskDynamics:
    """The run-time behaviour of one episode's task (see the module docstring)."""

    flaky_test_p: float
    """Probability that a run also fails :attr:`flaky_test`."""
    flaky_test: str
    """Id of the flaky test as the report shows it."""
    progress_reward: float
    """Reward per spec test the first time a run shows it passing."""
    progress_tests: tuple[str, ...]
    """The spec tests that count as progress (one per fact)."""
    rng: np.random.Generator
    """Draws the flakes (seeded from the env's RNG at reset)."""
    flaked: bool = False
    """Whether the latest run flaked."""
    earned: float = 0.0
    """Progress reward earned by runs since :meth:`take_reward` was last called."""
    passed_once: set[str] = field(default_factory=set)
    """Spec tests some run has already shown passing (each pays once)."""

    def run(self, report: TestReport) -> TestReport:
        """The report the agent sees for the sandbox's ``report`` (flaked or not)."""
        self.flaked = self.flaky_test_p > 0.0 and bool(self.rng.random() < self.flaky_test_p)
        if self.flaked:
            note = f"\nFAILED {self.flaky_test} - a timing-sensitive test failed; re-run to check"
            return replace(report, failed=(*report.failed, self.flaky_test), output=report.output + note,
                           success=False)
        new = [t for t in self.progress_tests if t in report.passed and t not in self.passed_once]
        self.passed_once.update(new)
        self.earned += self.progress_reward * len(new)
        return report

    def take_reward(self) -> float:
        """The progress reward earned since the last call (then zero)."""
        earned, self.earned = self.earned, 0.0
        return earned


def task_dynamics(metadata: dict[str, Any], rng: np.random.Generator) -> TaskDynamics | None:
    """The dynamics of a task with ``metadata``, or None for a task whose runs are plain.

    ``rng`` is drawn from only when the task has dynamics, so plain tasks leave the env's RNG
    stream (and thus which tasks it samples next) exactly as it was.
    """
    raw = metadata.get("dynamics")
    if not raw:
        return None
    seed = int(rng.integers(0, 2**63 - 1))
    return TaskDynamics(
        flaky_test_p=float(raw.get("flaky_test_p", 0.0)), flaky_test=str(raw["flaky_test"]),
        progress_reward=float(raw.get("progress_reward", 0.0)),
        progress_tests=tuple(raw.get("progress_tests", ())), rng=np.random.default_rng(seed),
    )
