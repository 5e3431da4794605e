"""The task record: a frozen, serialisable description of one episode's problem."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

TaskKind = Literal["code", "terminal"]
TaskSource = Literal["generated", "swebench", "terminal-bench", "user"]


@dataclass(frozen=True)
class Check:
    """How success is decided.

    ``kind="pytest"``: run ``command`` in the work dir; success iff every test id in ``must_pass``
    passes (read from pytest's ``-rA`` report). ``kind="script"``: run ``command`` (a checker
    script, e.g. ``python3 .check/check.py``); success iff it exits 0. ``kind="tbench"`` /
    ``"harbor"``: Terminal-Bench 1.x / 2.x, the output read as those harnesses read it
    (:mod:`compactrl.sandbox.tb_verdict`).
    ``hidden_files`` are written just before grading and are never visible to the agent
    (SWE-bench test patches, Terminal-Bench tests).
    """

    kind: Literal["pytest", "script", "tbench", "harbor"] = "pytest"
    command: str = "python -m pytest -q -rA -p no:cacheprovider"
    must_pass: tuple[str, ...] = ()
    hidden_files: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Check:
        """A check from its JSON form (``dataclasses.asdict``; ``must_pass`` back to a tuple)."""
        return cls(**{**raw, "must_pass": tuple(raw.get("must_pass", ()))})


@dataclass(frozen=True)
class Task:
    """One problem. ``files`` maps relative paths to contents (the initial work dir).

    ``metadata`` holds generator-specific, JSON-serialisable facts (for generated tasks: the facts
    the fix needs, where they live, the bug, the reference solution) used by the sim backend's
    verdict and by scripted policies; learned policies never see it.
    """

    id: str
    kind: TaskKind
    instruction: str
    files: dict[str, str]
    check: Check = field(default_factory=Check)
    setup: tuple[str, ...] = ()
    max_turns: int = 40
    time_limit_s: float = 600.0
    docker_image: str | None = None
    source: TaskSource = "generated"
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Task:
        raw = json.loads(text)
        check = Check.from_dict(raw.pop("check"))
        raw["setup"] = tuple(raw.get("setup", ()))
        return cls(check=check, **raw)
