"""Do the backends agree? Play the same episode on ``sim``, ``local`` and ``docker`` and compare.

An episode's *outcome* is what training depends on: the work dir's files at the end, the verdict
of the task's tests (success, and pass/fail of every ``must_pass`` test), the reward and how the
episode ended. The observations of the file tools (view, search, replace, create) are compared
too: they are computed by the env from the same file API, so they must match byte for byte.
(``test``/``shell`` observations are not compared: real pytest may list tests the sim does not
judge, and the sim's shell is an emulator whose own agreement is measured elsewhere.)

Action sources: :class:`~compactrl.policies.scripted.code.OraclePolicy` (reacts to what it sees),
fixed "no-op" sequences (tools that change nothing, then submit) and random edits inside the
tool language (:func:`random_edit_actions`). ``tests/sandbox/test_sandbox_fidelity.py`` runs
them property-based; ``benchmarks/sandbox_agreement.py`` prints the agreement rates.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compactrl.task import Task
from compactrl.tools import ToolCall, format_call

FILE_TOOLS = ("view", "search", "replace", "create")


@dataclass
class Outcome:
    """What one backend made of one episode."""

    backend: str
    files: dict[str, str]
    success: bool
    must_pass: dict[str, bool]
    reward: float
    terminated: bool
    truncated: bool
    file_tool_observations: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    sandbox_error: str | None = None
    test_output: str = ""
    tests_run: int = 0


def differences(a: Outcome, b: Outcome) -> list[tuple[str, str]]:
    """``(aspect, detail)`` for everything that differs between two outcomes (empty: they agree).

    Aspects: ``files``, ``verdict``, ``reward`` (reward, terminated or truncated), ``observation``
    (a file tool's output), ``sandbox``. A verdict difference where real pytest stopped at a
    collection error is detailed as such: pytest then runs no test at all.
    """
    out = []
    if a.files != b.files:
        only = sorted(set(a.files) ^ set(b.files))
        changed = sorted(p for p in set(a.files) & set(b.files) if a.files[p] != b.files[p])
        out.append(("files", f"only on one side {only[:5]}, different content {changed[:5]}"))
    if a.must_pass != b.must_pass or a.success != b.success:
        diff = sorted(t for t in a.must_pass if a.must_pass[t] != b.must_pass.get(t))
        out.append(("verdict", f"{_why_no_test_ran(a, b)}success {a.success} vs {b.success}, "
                               f"tests differing {diff[:5]}"))
    if (a.reward, a.terminated, a.truncated) != (b.reward, b.terminated, b.truncated):
        out.append(("reward", f"reward/terminated/truncated {(a.reward, a.terminated, a.truncated)} "
                              f"vs {(b.reward, b.terminated, b.truncated)}"))
    if a.file_tool_observations != b.file_tool_observations:
        pairs = list(zip(a.file_tool_observations, b.file_tool_observations))
        i = next((k for k, (x, y) in enumerate(pairs) if x != y), len(pairs))
        shown = pairs[i] if i < len(pairs) else ("<missing>", "<missing>")
        out.append(("observation", f"file-tool output {i}: {shown[0][:80]!r} vs {shown[1][:80]!r}"))
    if a.sandbox_error or b.sandbox_error:
        out.append(("sandbox", f"{a.sandbox_error!r} vs {b.sandbox_error!r}"))
    return out


def _why_no_test_ran(a: Outcome, b: Outcome) -> str:
    """``"<class>; "`` when a real pytest run stopped before running tests (the usual cause of a
    verdict difference with the sim), else ``""``."""
    for o in (a, b):
        if o.backend != "sim":
            if "during collection" in o.test_output:
                return "collection error; "
            if o.tests_run == 0:
                return "pytest did not start; "
    return ""


Actor = Callable[[list[dict[str, str]], Task], str]
"""Maps the messages so far (system, user task, then assistant/tool turns) to the next action."""


def oracle_actor(**kwargs: Any) -> Actor:
    from compactrl.policies.scripted.code import OraclePolicy
    from compactrl.types import PolicyRequest

    policy = OraclePolicy(**kwargs)
    return lambda messages, task: policy.respond(PolicyRequest(messages=list(messages), task=task))


def scripted_actor(actions: Sequence[str]) -> Actor:
    """Plays ``actions`` in order (then submits, if they run out before the episode ends)."""
    queue = list(actions)
    return lambda messages, task: queue.pop(0) if queue else "<tool>submit</tool>"


def play(backend: str, task: Task, actor: Actor, *, max_turns: int = 60,
         sandbox_kwargs: dict[str, Any] | None = None) -> Outcome:
    """One episode of ``task`` on ``backend``; the env and its sandbox are closed afterwards."""
    from compactrl.envs.code_env import CodeRepoEnv
    from compactrl.tools import parse_action

    env = CodeRepoEnv(task, backend=backend, max_turns=max_turns, time_limit_s=3600.0,
                      sandbox_kwargs=sandbox_kwargs)
    try:
        obs, _ = env.reset(options={"task": task})
        messages = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs}]
        outcome = Outcome(backend, {}, False, {}, 0.0, False, False)
        while True:
            action = actor(messages, task)
            outcome.actions.append(action)
            obs, reward, terminated, truncated, info = env.step(action)
            call = parse_action(action)
            if isinstance(call, ToolCall) and call.name in FILE_TOOLS:
                outcome.file_tool_observations.append(obs)
            messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": obs}]
            if terminated or truncated:
                break
        outcome.reward, outcome.terminated, outcome.truncated = reward, terminated, truncated
        outcome.sandbox_error = info.get("sandbox_error")
        if outcome.sandbox_error is None:
            sandbox = env._sandbox  # still open until reset/close: read the final state
            outcome.files = {p: sandbox.read_file(p) for p in sandbox.list_files()}
            report = sandbox.run_tests()
            outcome.success = report.success
            outcome.test_output = report.output
            outcome.tests_run = len(report.passed) + len(report.failed)
            outcome.must_pass = {t: t in report.passed for t in task.check.must_pass}
        return outcome
    finally:
        env.close()


# ----------------------------------------------------------------------------------------------
# action sequences


def noop_actions(task: Task, rng: random.Random, n: int = 6) -> list[str]:
    """Tools that change no file (view, search, test), then submit."""
    files = sorted(task.files)
    calls = []
    for _ in range(n):
        path = rng.choice(files)
        kind = rng.choice(("view", "view_range", "search", "search_in", "test"))
        if kind == "view":
            calls.append(ToolCall("view", path=path))
        elif kind == "view_range":
            lo = rng.randint(1, 30)
            calls.append(ToolCall("view", path=path, start=lo, end=lo + rng.randint(0, 40)))
        elif kind in ("search", "search_in"):
            words = task.files[path].split() or ["def"]
            calls.append(ToolCall("search", pattern=rng.choice(words)[:30],
                                  path=path if kind == "search_in" else None))
        else:
            calls.append(ToolCall("test"))
    return [format_call(c) for c in calls] + ["<tool>submit</tool>"]


_SNIPPETS = (
    "", "x", "0", "None", "pass\n", "return 1\n", "  ", "\n", "é✓🙂", "(", "def f(:\n", "import os\n",
    "raise ValueError('boom')\n", "1/0", "'''", "# comment\n", "\t", "\r\n", "assert False\n",
)


def random_edit_actions(task: Task, rng: random.Random, n: int = 8) -> list[str]:
    """Random calls inside the tool language that edit files (and some that only look), then submit.

    Edits are drawn to matter: fixing or mis-fixing the stale constants, breaking a module's syntax
    or import, rewriting fragments of real lines, creating files (modules, tests, junk), and
    simple file-changing shell commands.
    """
    files = sorted(task.files)
    meta = task.metadata
    actions = []
    for _ in range(n):
        kind = rng.choice(("fix", "fix", "misfix", "fragment", "fragment", "create", "break", "shell",
                           "view", "test"))
        path = rng.choice(files)
        if kind in ("fix", "misfix") and meta.get("fix"):
            fix = rng.choice(meta["fix"])
            key = fix["old"].split(" = ")[0]
            new = fix["new"] if kind == "fix" else rng.choice(
                (f"{key} = {fix['new'].split(' = ', 1)[1].strip()} + 0\n", f"{key} = None\n",
                 f"{key}: object = {fix['new'].split(' = ', 1)[1]}", f"{key} = int('x')\n", f"{key} = undefined\n"))
            call = ToolCall("replace", path=fix["file"], old=fix["old"], new=new)
        elif kind == "fragment":
            lines = [ln for ln in task.files[path].split("\n") if ln.strip()] or ["x"]
            line = rng.choice(lines)
            a = rng.randint(0, max(0, len(line) - 1))
            old = line[a : a + rng.randint(1, 20)] or line
            call = ToolCall("replace", path=path, old=old, new=rng.choice(_SNIPPETS) + rng.choice(("", old)))
        elif kind == "create":
            target = rng.choice((f"scratch/{rng.randint(0, 3)}.txt", "notes.md", path,
                                 f"{meta.get('package', 'pkg')}/extra.py", "tests/test_extra.py"))
            body = "".join(rng.choice(_SNIPPETS) for _ in range(rng.randint(0, 6)))
            if target == "tests/test_extra.py":
                body = rng.choice(("def test_extra():\n    assert True\n", "def test_extra():\n    assert False\n", body))
            call = ToolCall("create", path=target, content=body)
        elif kind == "break" and meta.get("bug_file"):
            call = ToolCall("create", path=meta["bug_file"], content=rng.choice(("def broken(:\n", "", "x = 1\n")))
        elif kind == "shell":
            call = ToolCall("shell", command=rng.choice((
                f"echo '# appended' >> {path}",
                f"sed -i 's/a/A/' {path}",
                f"rm -f {path}",
                "mkdir -p extra/dir && echo hi > extra/dir/f.txt",
                f"cp {path} copy_of_file.txt",
                f"mv {path} moved.txt",
                "ls -R | head -50",
            )))
        elif kind == "view":
            call = ToolCall("view", path=path)
        else:
            call = ToolCall("test")
        actions.append(format_call(call))
    return actions + ["<tool>submit</tool>"]


def compare(task: Task, backends: Sequence[str], actor_factory: Callable[[], Actor], *,
            sandbox_kwargs: dict[str, dict[str, Any]] | None = None,
            ) -> tuple[list[Outcome], list[tuple[str, str, str]]]:
    """Play ``task`` on every backend (a fresh actor each); ``(backend, aspect, detail)`` for each
    difference to the first backend's outcome."""
    outcomes = [play(b, task, actor_factory(), sandbox_kwargs=(sandbox_kwargs or {}).get(b)) for b in backends]
    diffs = [(o.backend, *d) for o in outcomes[1:] for d in differences(outcomes[0], o)]
    return outcomes, diffs
