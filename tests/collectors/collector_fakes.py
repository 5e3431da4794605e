"""A small env that follows the ContextBudget ``info`` contract, for collector unit tests.

It is not the product's env: it exists so that batching, grouping and failure handling can be
tested with exact, known traces (the integration tests use ``gym.make("CompactCode-v0")``).

Each episode has ``num_traces`` traces of ``steps_per_trace`` responses. A trace's tokens are a
prompt (``[1, task_seed % 50 + 3]``) followed, per step, by the response ids and one "tool output"
id (7). The last response of every trace but the last is a summary. Reward 1.0 at the end when the
task seed is even.
"""

from __future__ import annotations

import gymnasium as gym

from compactrl.types import TokenResponse, Trace


class FakeTraceEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, num_traces=2, steps_per_trace=2, fail_step=None, fail_mode="raise", fail_reset=False,
                 num_traces_fn=None):
        self.num_traces = num_traces
        self.num_traces_fn = num_traces_fn
        self.steps_per_trace = steps_per_trace
        self.fail_step = fail_step  # global step index (within the episode) at which to fail
        self.fail_mode = fail_mode  # "raise" | "sandbox_error"
        self.fail_reset = fail_reset
        self.observation_space = gym.spaces.Text(max_length=10_000)
        self.action_space = gym.spaces.Text(max_length=10_000)
        self.emitted: list[Trace] = []  # every trace put in info, for consistency checks
        self.emitted_by_key: dict[tuple[int, int], Trace] = {}  # (task seed, trace index) -> trace
        self.closed = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.fail_reset:
            raise RuntimeError("sandbox could not start")
        self.task_seed = seed
        self.task = f"task-{seed}"
        self.n_traces = self.num_traces_fn(seed) if self.num_traces_fn else self.num_traces
        self.trace_index = 0
        self.step_in_trace = 0
        self.steps = 0
        self._new_trace()
        return self._obs(), self._info()

    def _new_trace(self):
        self.tokens = [1, self.task_seed % 50 + 3]
        self.pmask = [False, False]
        self.smask = [False, False]
        self.logp = [float("nan")] * 2
        self.rewards = {}

    def _obs(self):
        return [{"role": "user", "content": f"task {self.task_seed} trace {self.trace_index}"}]

    def _info(self, **extra):
        last_step = self.step_in_trace == self.steps_per_trace - 1
        info = {
            "prompt_token_ids": list(self.tokens),
            "max_new_tokens": 8,
            "compaction_required": last_step and self.trace_index < self.n_traces - 1,
            "context_tokens": len(self.tokens),
            "trace_index": self.trace_index,
            "task_id": self.task,
        }
        info.update(extra)
        return info

    def _finish_trace(self, summary: bool) -> Trace:
        tr = Trace(list(self.tokens), list(self.pmask), list(self.smask), list(self.logp), dict(self.rewards),
                   trace_index=self.trace_index, ends_with_summary=summary, task_id=self.task)
        self.emitted.append(tr)
        self.emitted_by_key[(self.task_seed, self.trace_index)] = tr
        return tr

    def step(self, action):
        if self.fail_step is not None and self.steps == self.fail_step:
            if self.fail_mode == "raise":
                raise RuntimeError("container vanished")
            tr = self._finish_trace(False)
            return self._obs(), 0.0, False, True, self._info(sandbox_error="container vanished", trace=tr)
        ids = list(action.token_ids) if isinstance(action, TokenResponse) else [5]
        lps = list(action.log_probs) if isinstance(action, TokenResponse) and action.log_probs else [-1.0] * len(ids)
        summary = self.step_in_trace == self.steps_per_trace - 1 and self.trace_index < self.n_traces - 1
        self.tokens += ids
        self.pmask += [True] * len(ids)
        self.smask += [summary] * len(ids)
        self.logp += lps
        self.steps += 1
        self.step_in_trace += 1
        last = self.step_in_trace == self.steps_per_trace and self.trace_index == self.n_traces - 1
        reward = 1.0 if last and self.task_seed % 2 == 0 else 0.0
        if reward:
            self.rewards[len(self.tokens) - 1] = reward
        if last:
            tr = self._finish_trace(False)
            return self._obs(), reward, True, False, self._info(trace=tr, success=reward > 0)
        if summary:
            tr = self._finish_trace(True)
            self.trace_index += 1
            self.step_in_trace = 0
            self._new_trace()
            return self._obs(), 0.0, False, False, self._info(trace=tr, compacted=True)
        self.tokens.append(7)
        self.pmask.append(False)
        self.smask.append(False)
        self.logp.append(float("nan"))
        return self._obs(), 0.0, False, False, self._info()

    def close(self):
        self.closed = True


class EchoPolicy:
    """Answers every request with token ids derived from its prompt (deterministic)."""

    def __init__(self):
        self.calls: list[int] = []  # batch size of each act() call

    def act(self, requests):
        self.calls.append(len(requests))
        out = []
        for r in requests:
            n = 2 + len(r.prompt_token_ids) % 3
            ids = [10 + (len(r.prompt_token_ids) + i) % 20 for i in range(n)]
            out.append(TokenResponse("x" * n, ids, [-0.5] * n, finished=True))
        return out
