"""Tool-using text environments: :class:`ToolEnv` (the base) and :class:`CodeRepoEnv`.

The observation is text: ``reset`` returns the task message (instruction plus the list of files),
``step`` the output of the tool the response called. The action is the model's whole response; the
env parses exactly one tool call from it (:mod:`compactrl.tools`). Malformed responses are
observations explaining the format, never exceptions, and are counted in ``info["format_errors"]``.

File tools (view, search, replace, create) run here on top of the sandbox's ``read_file`` /
``write_file`` / ``list_files``, so they behave identically on every backend; only ``test``,
``submit`` and ``shell`` reach the sandbox's processes.

Reward is 1.0 iff the task's check passes when the agent submits (or, if the episode is truncated
by the turn or time limit, when it is graded once at that end), else 0.0. ``terminated`` on submit,
``truncated`` on limits and on sandbox failures (``info["sandbox_error"]``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from compactrl.envs.spaces import UnicodeText
from compactrl.sandbox import Sandbox, SandboxError, TestReport, make_sandbox
from compactrl.task import Step, Task, prepared
from compactrl.tasksets.generators.dynamics import task_dynamics
from compactrl.tools import FormatError, ToolCall, describe_tools, normalize_path, parse_action

log = logging.getLogger(__name__)

CODE_TOOLS: tuple[str, ...] = ("view", "search", "replace", "create", "test", "shell", "submit")


@runtime_checkable
class TaskSampler(Protocol):
    """Where an env gets its tasks: ``sample`` draws one with the env's seeded RNG."""

    def sample(self, rng: np.random.Generator) -> Task: ...


class TaskList:
    """A fixed list of tasks, sampled uniformly (``task(i)`` picks one by index)."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        if not tasks:
            raise ValueError("task_source: expected a non-empty sequence of Task, got an empty one")
        self.tasks = list(tasks)

    def sample(self, rng: np.random.Generator) -> Task:
        return self.tasks[int(rng.integers(len(self.tasks)))]

    def task(self, index: int) -> Task:
        return self.tasks[index % len(self.tasks)]


def as_task_sampler(source: TaskSampler | Task | Sequence[Task]) -> TaskSampler:
    """Accept a sampler, a single task or a sequence of tasks."""
    if isinstance(source, Task):
        return TaskList([source])
    if isinstance(source, TaskSampler):
        return source
    if isinstance(source, Sequence) and all(isinstance(t, Task) for t in source):
        return TaskList(source)
    raise ValueError(f"task_source: expected a TaskSampler, a Task or a sequence of Task, got {type(source).__name__}")


class ToolEnv(gym.Env[str, str]):
    """A Gymnasium env where each action is a response holding one tool call.

    Subclasses choose the task source, the allowed tools and the system prompt.

    Args:
        task_source: where tasks come from (a :class:`TaskSampler`, a Task, or a list of them).
        tools: the tool names this env accepts (calls to others are format errors).
        backend: sandbox backend (``sim``, ``local``, ``docker``).
        max_turns: turn limit; ``None`` uses each task's ``max_turns``.
        time_limit_s: wall-clock limit per episode; ``None`` uses each task's ``time_limit_s`` on a
            real sandbox and none on ``sim`` (a simulated episode ends by its turns alone, so its
            outcome does not depend on how loaded the machine is).
        sandbox_kwargs: passed to :func:`~compactrl.sandbox.make_sandbox`.
        max_view_lines: most lines one ``view`` shows (longer files are read in pieces).
        max_search_results: most ``search`` matches shown.
        max_observation_chars: observations longer than this are clipped head+tail.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        task_source: TaskSampler | Task | Sequence[Task],
        *,
        tools: Sequence[str] = CODE_TOOLS,
        backend: str = "sim",
        max_turns: int | None = None,
        time_limit_s: float | None = None,
        sandbox_kwargs: dict[str, Any] | None = None,
        max_view_lines: int = 100,
        max_search_results: int = 50,
        max_observation_chars: int = 16_000,
        render_mode: str | None = None,
    ) -> None:
        self.task_source = as_task_sampler(task_source)
        unknown = [t for t in tools if t not in CODE_TOOLS]
        if unknown or "submit" not in tools:
            raise ValueError(f"tools: expected a subset of {CODE_TOOLS} including 'submit', got {tuple(tools)}")
        _positive(max_turns=max_turns, time_limit_s=time_limit_s, max_view_lines=max_view_lines,
                  max_search_results=max_search_results, max_observation_chars=max_observation_chars)
        if max_observation_chars < 200:
            raise ValueError(f"max_observation_chars: expected >= 200, got {max_observation_chars}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode: expected None or 'ansi', got {render_mode!r}")
        make_sandbox(backend, **(sandbox_kwargs or {})).close()  # fail fast on a bad backend or kwargs
        self.tools = tuple(tools)
        self.backend, self.sandbox_kwargs = backend, dict(sandbox_kwargs or {})
        self.max_turns, self.time_limit_s = max_turns, time_limit_s
        self.max_view_lines, self.max_search_results = max_view_lines, max_search_results
        self.max_observation_chars = max_observation_chars
        self.render_mode = render_mode
        self.observation_space = UnicodeText(max_observation_chars)
        self.action_space = UnicodeText(10_000_000)
        self.task: Task | None = None
        self._sandbox: Sandbox | None = None
        self._done = True
        self._turn = self._format_errors = self._tool_errors = 0
        self._started = 0.0
        self._last_obs = ""
        self._line_cache: dict[str, tuple[str, list[str]]] = {}
        self._dynamics = None
        self._steps: list[Step] = []
        self._stage, self._stage_results = 0, []

    # -- prompts ---------------------------------------------------------------------------------
    @property
    def system_prompt(self) -> str:
        return "You work in a project's work dir through tools.\n" + describe_tools(self.tools)

    def task_message(self, task: Task) -> str:
        files = self._sandbox.list_files() if self._sandbox else sorted(task.files)
        listing = "\n".join(f"{p} ({_count_lines(task.files.get(p, ''))} lines)" for p in files)
        return f"{task.instruction}\n\nFiles in the work dir ({len(files)}):\n{listing}"

    # -- gymnasium API ---------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = options or {}
        if "task" in options:
            task = options["task"]
        elif "index" in options and hasattr(self.task_source, "task"):
            task = self.task_source.task(int(options["index"]))
        else:
            task = self.task_source.sample(self.np_random)
        self._close_sandbox()
        task = prepared(task, self.backend)  # the task set's state for this backend (compactrl.task.Build)
        self._sandbox = make_sandbox(self.backend, **self.sandbox_kwargs)
        self._sandbox.start(task)
        self._line_cache = {}
        self.task = task
        self._dynamics = task_dynamics(task.metadata, self.np_random)  # flaky runs, progress rewards
        self._steps = list(task.steps)  # a multi-step task's steps (see _after_submit)
        self._stage, self._stage_results = 0, []
        self._done = False
        self._turn = self._format_errors = self._tool_errors = 0
        self._started = time.monotonic()
        self._last_obs = self._clip(self.task_message(task))
        return self._last_obs, {"task_id": task.id, "turn": 0, "format_errors": 0, "tool_errors": 0, "tool": None}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._done or self.task is None:
            raise RuntimeError("step() called on a finished or unstarted episode: call reset() first")
        self._turn += 1
        call = parse_action(action)
        info: dict[str, Any] = {"task_id": self.task.id, "turn": self._turn, "tool": None}
        reward, terminated, truncated, report = 0.0, False, False, None
        try:
            if isinstance(call, FormatError):
                self._format_errors += 1
                obs = f"Format error: {call.message}.\nAnswer with exactly one tool call, e.g. <tool>view README.md</tool>."
            elif call.name not in self.tools:
                self._format_errors += 1
                obs = f"Format error: the tool {call.name!r} is not available here; tools: {', '.join(self.tools)}."
            else:
                info["tool"] = call.name
                if call.name == "submit":
                    report = self._run_tests()
                    terminated = not (self._dynamics and self._dynamics.flaked)
                    obs = "Submitted.\n" + format_report(report) + ("" if terminated else _FLAKED_SUBMIT)
                    if terminated and self._steps:
                        terminated, next_step = self._after_submit(report)
                        obs += next_step
                else:
                    obs = self._run_tool(call)
            if not terminated and self._over_limits():
                truncated, report = True, self._run_tests()
        except SandboxError as exc:
            log.warning("sandbox failure in task %s: %s", self.task.id, exc)
            truncated, report = True, None
            info["sandbox_error"] = str(exc)
            obs = f"The sandbox failed and the episode ends: {exc}"
        self._done = terminated or truncated
        if self._done:
            reward = float(report is not None and report.success)
            info.update(_final_info(report))
            if self._steps:
                if truncated and report is not None:  # the step under way is graded at the limit, as Harbor's
                    self._stage_results.append(bool(report.success))
                reward = steps_reward(self._stage_results, self.task.steps_reward or "mean")
                info["success"] = reward >= 1.0
                info["steps"] = [{"name": s.name, "success": ok} for s, ok in zip(self._steps, self._stage_results)]
                # scalars too (episode records keep only those)
                info["steps_graded"], info["steps_passed"] = len(self._stage_results), sum(self._stage_results)
                info["steps_summary"] = "; ".join(f"{s['name']}: {'pass' if s['success'] else 'fail'}" for s in info["steps"])
        if self._dynamics:
            reward += self._dynamics.take_reward()
        info["format_errors"], info["tool_errors"] = self._format_errors, self._tool_errors
        self._last_obs = self._clip(obs)
        return self._last_obs, reward, terminated, truncated, info

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None

    def close(self) -> None:
        self._close_sandbox()
        self._done = True

    # -- tools -----------------------------------------------------------------------------------
    def _over_limits(self) -> bool:
        max_turns = self.max_turns or self.task.max_turns
        limit_s = self.time_limit_s or (None if self.backend == "sim" else self.task.time_limit_s)
        return self._turn >= max_turns or (limit_s is not None and time.monotonic() - self._started > limit_s)

    def _run_tool(self, call: ToolCall) -> str:
        try:
            if call.name == "view":
                return self._view(call.path, call.start, call.end)
            if call.name == "search":
                return self._search(call.pattern, call.path)
            if call.name == "replace":
                return self._replace(call.path, call.old, call.new)
            if call.name == "create":
                return self._create(call.path, call.content)
            if call.name == "test":
                return format_report(self._run_tests())
            if call.name == "shell":
                result = self._sandbox.exec(call.command)
                note = " (timed out)" if result.timed_out else ""
                return f"{result.output.rstrip()}\n[exit code {result.exit_code}{note}]"
        except (OSError, ValueError) as exc:  # FileNotFoundError, PermissionError, bad path...
            self._tool_errors += 1
            return f"Error: {exc}"
        raise AssertionError(f"unhandled tool {call.name}")  # unreachable: parse_action knows the tools

    def _view(self, path: str, start: int | None, end: int | None) -> str:
        rel = normalize_path(path)
        try:
            content = self._sandbox.read_file(rel)
        except IsADirectoryError:
            inside = [p for p in self._sandbox.list_files() if rel == "" or p.startswith(rel + "/")]
            return f"{path} is a directory with {len(inside)} files:\n" + "\n".join(inside)
        lines = self._lines(rel, content)
        n = len(lines)
        if n == 0:
            return f"{rel} is empty."
        lo = start or 1
        if lo > n:
            self._tool_errors += 1
            return f"Error: {rel} has {n} lines; START must be <= {n}."
        hi = min(end or n, n, lo + self.max_view_lines - 1)
        body = "\n".join(map(str.__add__, _line_prefixes(hi)[lo - 1 : hi], lines[lo - 1 : hi]))
        more = f"\n[{n - hi} more lines: view {rel} {hi + 1} {min(n, hi + self.max_view_lines)}]" if hi < n and hi < (end or n) else ""
        return f"{rel} (lines {lo}-{hi} of {n})\n{body}{more}"

    def _search(self, pattern: str, path: str | None) -> str:
        scope = normalize_path(path) if path is not None else ""
        hits, total = [], 0
        for file in self._sandbox.list_files():
            if scope and file != scope and not file.startswith(scope + "/"):
                continue
            content = self._sandbox.read_file(file)
            if pattern not in content:
                continue
            for i, line in enumerate(self._lines(file, content), start=1):
                if pattern in line:
                    total += 1
                    if len(hits) < self.max_search_results:
                        hits.append(f"{file}:{i}:{line[:200]}")
        if not hits:
            return f"No matches for {pattern!r}" + (f" under {scope}." if scope else ".")
        extra = f"\n[{total - len(hits)} more matches; narrow the search]" if total > len(hits) else ""
        return "\n".join(hits) + extra

    def _replace(self, path: str, old: str, new: str) -> str:
        rel = normalize_path(path)
        content = self._sandbox.read_file(rel)
        count = content.count(old)
        if count != 1:
            self._tool_errors += 1
            if count == 0:
                return (f"Error: the <old> text does not occur in {rel}; it must match exactly "
                        "(indentation, newlines). View the file to copy it.")
            return f"Error: the <old> text occurs {count} times in {rel}; include more lines so it matches once."
        at = content.index(old)
        self._sandbox.write_file(rel, content[:at] + new + content[at + len(old):])
        first = content.count("\n", 0, at) + 1
        new_lines = _split_lines(new) if new else []
        shown = "\n".join(map(str.__add__, _line_prefixes(first + 20)[first - 1 :], new_lines[:20]))
        return f"Replaced {_count_lines(old)} line(s) of {rel} at line {first} with {len(new_lines)} line(s):\n{shown}".rstrip()

    def _create(self, path: str, content: str) -> str:
        rel = normalize_path(path)
        existed = rel in self._sandbox.list_files()
        self._sandbox.write_file(rel, content)
        return f"{'Overwrote' if existed else 'Created'} {rel} ({_count_lines(content)} lines)."

    # -- helpers ---------------------------------------------------------------------------------
    def _run_tests(self) -> TestReport:
        # a later step of a multi-step task has its own tests
        check = self._steps[self._stage].check if self._steps and self._stage > 0 else None
        report = self._sandbox.run_tests(check)
        return self._dynamics.run(report) if self._dynamics else report

    def _after_submit(self, report: TestReport) -> tuple[bool, str]:
        """A multi-step task (``Task.steps``, as Harbor runs one): the step's verdict is kept; the
        episode goes on with the next step's instruction, in the same sandbox and conversation, unless
        this was the last step or its reward is below the step's ``min_reward``. ``(terminated, text)``."""
        self._stage_results.append(bool(report.success))
        step, n = self._steps[self._stage], len(self._steps)
        gate = step.min_reward
        if self._stage == n - 1 or (gate is not None and float(report.success) < gate):
            return True, ""
        self._stage += 1
        nxt = self._steps[self._stage]
        return False, f"\n\nStep {self._stage + 1} of {n} ({nxt.name}):\n{nxt.instruction}"

    def _lines(self, path: str, content: str) -> list[str]:
        """Lines of a file, cached while its content stays the same object (views are frequent)."""
        cached = self._line_cache.get(path)
        if cached is None or cached[0] is not content:
            cached = self._line_cache[path] = (content, _split_lines(content))
        return cached[1]

    def _clip(self, text: str) -> str:
        cap = self.max_observation_chars
        if len(text) <= cap:
            return text
        marker = f"\n[... {len(text) - cap + 100} characters clipped ...]\n"
        head = (cap - len(marker)) * 2 // 3
        tail = cap - len(marker) - head
        return text[:head] + marker + text[len(text) - tail:]

    def _close_sandbox(self) -> None:
        if self._sandbox is not None:
            try:
                self._sandbox.close()
            except SandboxError as exc:
                log.warning("closing the sandbox failed: %s", exc)
            self._sandbox = None


_FLAKED_SUBMIT = "\nThe run failed on a flaky test, so the submission was not accepted: submit again."


def _positive(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise ValueError(f"{name}: expected a positive number or None, got {value!r}")


_PREFIXES: list[str] = []


def _line_prefixes(n: int) -> list[str]:
    """``["   1\t", "   2\t", ...]`` up to at least ``n`` (formatting numbers per view is slow)."""
    if len(_PREFIXES) < n:
        _PREFIXES.extend(f"{i:>4}\t" for i in range(len(_PREFIXES) + 1, max(n, 2 * len(_PREFIXES), 1024) + 1))
    return _PREFIXES


def _split_lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _count_lines(text: str) -> int:
    return len(_split_lines(text))


def steps_reward(results: Sequence[bool], strategy: str = "mean") -> float:
    """A multi-step task's reward from its graded steps' (each 1.0 or 0.0), as Harbor derives a trial's:
    ``mean`` over the steps that were graded (steps a failed ``min_reward`` skipped are left out),
    ``final`` the last graded step's; 0.0 when none was graded."""
    if strategy not in ("mean", "final"):
        raise ValueError(f"steps_reward: expected 'mean' or 'final', got {strategy!r}")
    if not results:
        return 0.0
    return float(results[-1]) if strategy == "final" else sum(map(float, results)) / len(results)


def format_report(report: TestReport) -> str:
    """The ``test`` tool's output: counts, then every failing test (the others passed)."""
    head = f"Tests: {len(report.passed)} passed, {len(report.failed)} failed."
    failed = "".join(f"\nFAILED {t}" for t in report.failed)
    tail = "\nAll tests passed." if report.success and not report.failed else ""
    if not report.passed and not report.failed:  # no test ids to show: say what the run did instead
        last = (report.log_tail.strip().splitlines() or [""])[-1].strip()
        bits = [f"exit code {report.exit_code}"] if report.exit_code is not None else []
        bits += ["timed out"] if report.timed_out else []
        bits += [f"limit hit: {report.limit_hit}"] if report.limit_hit else []
        bits += [last[:300]] if last else []
        tail += f"\n(no test ids in the output: {'; '.join(bits)})" if bits else ""
    return head + failed + tail


def _final_info(report: TestReport | None) -> dict[str, Any]:
    if report is None:
        return {"success": False, "tests_passed": 0, "tests_failed": 0, "test_summary": "not graded"}
    info = {
        "success": bool(report.success),
        "tests_passed": len(report.passed),
        "tests_failed": len(report.failed),
        "test_summary": format_report(report),
        # the verdict's evidence, for reports (eval's --out records, tasks validate)
        "test_timed_out": bool(report.timed_out),
        "test_log_tail": report.log_tail,
        "test_output": report.output if report.log is None else report.log,  # whole: records re-grade it
        "test_output_complete": bool(report.log_complete),
    }
    if report.exit_code is not None:
        info["test_exit_code"] = int(report.exit_code)
    if report.limit_hit:
        info["test_limit_hit"] = report.limit_hit
    return info


class CodeRepoEnv(ToolEnv):
    """Fix a bug in a small Python repository (``CompactCode-v0`` before context budgeting).

    ``task_source=None`` draws generated tasks of ``difficulty`` (``easy``, ``default``, ``hard``
    or a :class:`~compactrl.tasksets.generators.code.CodeTaskConfig`) from ``split`` (``train``,
    ``val``, ``test``; disjoint). ``task_preset``, when given, names the generator preset in place
    of ``difficulty`` (a preset the training config's ``env.difficulty`` does not list travels as
    ``env.env_kwargs='{"task_preset": "variable_chain"}'``). ``reset(options={"index": i})`` picks
    task ``i`` of the split; ``reset(options={"task": task})`` a given task. Other keyword
    arguments: see :class:`ToolEnv`.
    """

    def __init__(
        self,
        task_source: TaskSampler | Task | Sequence[Task] | None = None,
        *,
        difficulty: Any = "default",
        split: str = "train",
        backend: str = "sim",
        task_preset: str | None = None,
        **kwargs: Any,
    ) -> None:
        difficulty = task_preset or difficulty
        if task_source is None:
            from compactrl.tasksets.generators.code import CodeTaskGenerator, GeneratedTasks

            task_source = GeneratedTasks(CodeTaskGenerator(difficulty), split)
        self.difficulty, self.split = difficulty, split
        super().__init__(task_source, backend=backend, **kwargs)

    @property
    def system_prompt(self) -> str:
        return "Fix the Python repository in the work dir so its tests pass, then submit.\n" + describe_tools(self.tools)
