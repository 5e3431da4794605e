"""ContextBudget: the wrapper that owns an agent's context, forces compaction and emits exact traces.

The observation is the current trace's chat messages; the wrapper keeps the exact token ids of
that trace, built incrementally (each turn is tokenised once, when it is appended), and which of
them the policy sampled. Token accounting, per response:

* The prompt of every model call is ``trace ids + generation prompt`` (``info["prompt_token_ids"]``);
  the response may have ``info["max_new_tokens"]`` ids.
* A :class:`~compactrl.types.TokenResponse` contributes its ``token_ids`` verbatim as policy tokens
  with its log-probs. It must carry at least one id (a sampler with ``max_new_tokens >= 1`` always
  does). Ids past ``max_new_tokens`` are cut off (the response then counts as unfinished).
* A plain ``str`` is tokenised and followed by the end-of-turn id, as if sampled: all of them are
  policy tokens (log-prob ``nan``). Tokens past ``max_new_tokens`` are cut off likewise. So the
  empty string is one policy token, the end-of-turn id.
* A response whose last id is not a stop id (end-of-turn or eos: it hit ``max_new_tokens``, was
  cut off, or stopped on a stop string) is closed with the end-of-turn id as a *non-policy* token:
  the model did not choose to stop there.
* Template tokens (generation prompt, the footer after the end-of-turn id, headers), the prompt,
  tool outputs and the summary instruction are never policy tokens.
* Each step's reward sits on the last policy token of the response that earned it (a summary
  step's reward is 0.0); every response therefore has an entry in ``Trace.rewards``.

Compaction. After a tool output, the next prompt must leave room for the response *and* for asking
for and writing a summary after it (while compactions remain); if it does not, the observation
becomes the current trace plus the summary instruction (the new tool output is held back). The next
action is the summary; the trace ends there (its summary tokens are ``summary_mask``), and a new
trace starts from system + task + ``summary_header`` + summary (its sampled ids, verbatim) + the
held-back tool output, without stepping the inner env. With no compactions left, a prompt that would
overflow the budget truncates the episode. Hence, at every model call, ``len(prompt) + reserve <=
budget`` (checked against the system prompt at construction and against each task at reset).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from compactrl.envs.spaces import ChatMessages
from compactrl.types import TokenResponse, Trace
from compactrl.wrappers.chat_format import ChatFormat, chat_format, valid_unicode
from compactrl.wrappers.context_views import PromptIds

log = logging.getLogger(__name__)

DEFAULT_SUMMARY_INSTRUCTION = (
    "Your context is nearly full. Write a summary of your progress for your future self: the facts "
    "you found (names, values, file paths, line numbers), what you changed, what is left to do and "
    "your next step. Write only the summary; your context will restart from it."
)


@dataclass(frozen=True)
class ContextBudgetConfig:
    """Parameters of :class:`ContextBudget` (token counts are in the wrapper's tokenizer's ids)."""

    budget: int = 2048
    """Maximum tokens of prompt plus response at any model call."""
    reserve: int = 256
    """Tokens kept free for the next response: every response's ``max_new_tokens``."""
    tool_output_cap: int = 384
    """Maximum content tokens of one tool output; longer ones keep their head and tail around a marker."""
    max_compactions: int = 8
    """Summaries allowed per episode; once spent, overflowing the budget truncates the episode."""
    summary_instruction: str = DEFAULT_SUMMARY_INSTRUCTION
    """The user message that asks for a summary."""
    summary_header: str = "Summary of your earlier work:\n"
    """Text put before the summary in the first user message of the next trace."""
    max_summary_tokens: int | None = None
    """``max_new_tokens`` of a summary (``None``: the reserve); at most the reserve."""
    clip_marker: str = "\n[... {n} tokens clipped ...]\n"
    """Put between head and tail of a clipped tool output; ``{n}`` is the number of tokens removed."""
    tool_role: str = "tool"
    """Chat role of tool outputs (``"user"`` for chat templates without a tool role)."""

    def __post_init__(self) -> None:
        _positive("budget", self.budget)
        _positive("reserve", self.reserve)
        _positive("tool_output_cap", self.tool_output_cap)
        if not isinstance(self.max_compactions, int) or self.max_compactions < 0:
            raise ValueError(f"max_compactions: expected an int >= 0, got {self.max_compactions!r}")
        if self.reserve >= self.budget:
            raise ValueError(f"reserve: expected less than budget={self.budget}, got {self.reserve}")
        if self.max_summary_tokens is not None and not 1 <= self.max_summary_tokens <= self.reserve:
            raise ValueError(
                f"max_summary_tokens: expected None or 1..reserve={self.reserve}, got {self.max_summary_tokens!r}"
            )
        if not isinstance(self.summary_instruction, str) or not self.summary_instruction.strip():
            raise ValueError(f"summary_instruction: expected a non-empty string, got {self.summary_instruction!r}")
        if not isinstance(self.summary_header, str):
            raise ValueError(f"summary_header: expected a string, got {self.summary_header!r}")
        if not isinstance(self.clip_marker, str) or self.clip_marker.count("{n}") != 1:
            raise ValueError(f"clip_marker: expected a string with one '{{n}}' field, got {self.clip_marker!r}")
        if self.tool_role not in ("tool", "user"):
            raise ValueError(f"tool_role: expected 'tool' or 'user', got {self.tool_role!r}")

    @property
    def summary_tokens(self) -> int:
        """The ``max_new_tokens`` of a summary."""
        return self.reserve if self.max_summary_tokens is None else self.max_summary_tokens


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")


@dataclass(frozen=True)
class _Response:
    """An action as the trace records it."""

    text: str
    ids: list[int]
    log_probs: list[float]
    sampled_eot: bool  # the last id is a stop id the policy chose


class _TraceBuilder:
    """Growing per-token lists of the current trace."""

    def __init__(self, prefix: list[int]) -> None:
        self.ids = list(prefix)
        self.policy = [False] * len(prefix)
        self.summary = [False] * len(prefix)
        self.log_probs = [math.nan] * len(prefix)
        self.rewards: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, ids, *, policy: bool = False, summary: bool = False, log_probs=None) -> None:
        n = len(ids)
        self.ids.extend(ids)
        self.policy.extend([policy] * n)
        self.summary.extend([summary] * n)
        self.log_probs.extend(log_probs if log_probs is not None else [math.nan] * n)

    def finish(self, **meta: Any) -> Trace:
        return Trace(self.ids, self.policy, self.summary, self.log_probs, self.rewards, **meta)


class ContextBudget(gym.Wrapper):
    """Keeps an LLM env's context under a token budget by forcing summaries; emits exact traces.

    The inner env's observation after ``reset`` is the task text, after ``step`` a tool output
    (both ``str``); its action is the response text; ``env.unwrapped.system_prompt`` is the system
    message. See the module docstring for the token accounting and ``docs/context_budget.md``.

    Args:
        env: the inner env.
        config: the parameters (default :class:`ContextBudgetConfig`).
        tokenizer: a Hugging Face tokenizer with a chat template (default: the process's shared one,
            :func:`compactrl.tokenizer.shared_tokenizer`; read, never changed).
        **overrides: fields of ``config`` to replace, e.g. ``budget=4096``.
    """

    def __init__(self, env: gym.Env, config: ContextBudgetConfig | None = None, *, tokenizer: Any = None,
                 **overrides: Any) -> None:
        super().__init__(env)
        config = config or ContextBudgetConfig()
        if overrides:
            unknown = set(overrides) - set(ContextBudgetConfig.__dataclass_fields__)
            if unknown:
                raise ValueError(f"unknown ContextBudget parameters {sorted(unknown)}")
            config = ContextBudgetConfig(**{**config.__dict__, **overrides})
        self.config = config
        if tokenizer is None:
            from compactrl.tokenizer import shared_tokenizer

            tokenizer = shared_tokenizer()
        self.tokenizer = tokenizer
        self.fmt: ChatFormat = chat_format(tokenizer, tool_role=config.tool_role)
        self._instruction_ids = self.fmt.turn("user", config.summary_instruction)
        self._instruction_msg = _message("user", config.summary_instruction)
        self._summary_header_ids = self.fmt.encode(config.summary_header)
        n_gen = len(self.fmt.generation_prompt)
        # room to close a response, ask for a summary and write it (see module docstring)
        self._summary_room = 1 + len(self.fmt.assistant_footer_rest) + len(self._instruction_ids) + n_gen + config.reserve
        self._check_clip_marker()
        self.observation_space = _messages_space(env, config)
        self._episode_id = -1
        self._active = False
        self._check_fits(self._system_prompt(), "", where="construction")

    # -- gymnasium API ---------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        task_text, inner_info = self.env.reset(seed=seed, options=options)
        task_text = valid_unicode(task_text)
        system = self._system_prompt()
        self._check_fits(system, task_text, where=f"task {inner_info.get('task_id', '')!r}")
        self._episode_id += 1
        self._task_id = str(inner_info.get("task_id", ""))
        self._prefix_msgs = [_message("system", system), _message("user", task_text)]
        self._prefix_ids = self.fmt.prefix(system, task_text)
        self._trace = _TraceBuilder(self._prefix_ids)
        self._messages = list(self._prefix_msgs)
        self._trace_index = 0
        self._compactions = 0
        self._summary_tokens = 0
        self._context_max = 0
        self._compaction_required = False
        self._held_tool: tuple[str, list[int]] | None = None
        self._active = True
        return self._observation(), self._info(inner_info)

    def step(self, action: str):
        if not self._active:
            raise RuntimeError("ContextBudget.step called before reset() or after the episode ended")
        max_new = self.config.summary_tokens if self._compaction_required else self.config.reserve
        resp = self._response(action, max_new)
        if self._compaction_required:
            return self._write_summary(resp)
        pos = self._append_response(resp, summary=False)
        tool_text, reward, terminated, truncated, inner_info = self.env.step(resp.text)
        self._trace.rewards[pos] = float(reward)
        self._messages.append(_message("assistant", resp.text))
        tool_text, tool_ids, clipped = self._tool_turn(tool_text)
        self._messages.append(_message("tool", tool_text))
        extra = {"clipped_tokens": clipped}
        if terminated or truncated:
            return self._end(reward, terminated, truncated, inner_info, extra)
        prompt_len = len(self._trace) + len(tool_ids) + len(self.fmt.generation_prompt)
        if self._fits(prompt_len, soft=self._compactions < self.config.max_compactions):
            self._trace.add(tool_ids)
        elif self._compactions < self.config.max_compactions:
            self._messages[-1] = self._instruction_msg
            self._held_tool = (tool_text, tool_ids)
            self._trace.add(self._instruction_ids)
            self._compaction_required = True
        else:
            extra["budget_exhausted"] = True
            return self._end(reward, False, True, inner_info, extra)
        return self._observation(), float(reward), False, False, self._info(inner_info, **extra)

    # -- steps ---------------------------------------------------------------------------------------

    def _write_summary(self, resp: _Response):
        pos = self._append_response(resp, summary=True)
        self._trace.rewards[pos] = 0.0
        finished = self._finish_trace(ends_with_summary=True)
        self._compactions += 1
        self._summary_tokens += sum(finished.summary_mask)
        content = resp.ids[:-1] if resp.sampled_eot else resp.ids
        summary_ids = [*self.fmt.user.header, *self._summary_header_ids, *content, *self.fmt.user.footer]
        held_text, held_ids = self._held_tool
        self._trace = _TraceBuilder(self._prefix_ids + summary_ids + held_ids)
        self._messages = [*self._prefix_msgs, _message("user", self.config.summary_header + resp.text),
                          _message("tool", held_text)]
        self._trace_index += 1
        self._compaction_required, self._held_tool = False, None
        if not self._fits(len(self._trace) + len(self.fmt.generation_prompt), soft=False):
            raise RuntimeError("ContextBudget: a new trace does not fit its budget (validated at reset; a bug)")
        return self._observation(), 0.0, False, False, self._info({}, compacted=True, trace=finished)

    def _end(self, reward, terminated, truncated, inner_info, extra):
        self._active = False
        trace = self._finish_trace(ends_with_summary=False)
        totals = {
            "num_traces": self._trace_index + 1,
            "num_compactions": self._compactions,
            "summary_tokens": self._summary_tokens,
            "context_tokens_max": self._context_max,
            "budget_exhausted": False,
        }
        info = {**inner_info, "context_tokens": len(trace), "trace_index": self._trace_index,
                "compaction_required": False, "compacted": False, "task_id": self._task_id,
                "trace": trace, **totals, **extra}
        return self._observation(), float(reward), bool(terminated), bool(truncated), info

    def _finish_trace(self, *, ends_with_summary: bool) -> Trace:
        return self._trace.finish(trace_index=self._trace_index, episode_id=self._episode_id,
                                  ends_with_summary=ends_with_summary, task_id=self._task_id)

    # -- token bookkeeping ---------------------------------------------------------------------------

    def _response(self, action: str, max_new: int) -> _Response:
        if isinstance(action, TokenResponse):
            ids, text = list(action.token_ids), str(action)
            if not ids:
                raise ValueError("action: a TokenResponse must carry at least one sampled token id, got none")
            bad = [i for i in ids if not 0 <= i < self.fmt.vocab_size]
            if bad:
                raise ValueError(f"action: token ids must lie in [0, {self.fmt.vocab_size}), got {bad[:5]}")
            lps = list(action.log_probs) if action.log_probs is not None else [math.nan] * len(ids)
            sampled_eot = ids[-1] in self.fmt.stop_ids
        elif isinstance(action, str):
            # the text passed on is the text the ids encode (lone surrogates become U+FFFD)
            text = valid_unicode(action)
            ids = [*self.fmt.encode(text), self.fmt.end_of_turn]
            lps, sampled_eot = [math.nan] * len(ids), True
        else:
            raise ValueError(f"action: expected a str or TokenResponse, got {type(action).__name__}")
        if len(ids) > max_new:
            if isinstance(action, TokenResponse):
                log.warning("a TokenResponse of %d ids exceeds max_new_tokens=%d: cut", len(ids), max_new)
            ids, lps, sampled_eot = ids[:max_new], lps[:max_new], False
            text = self.fmt.decode(ids)
        return _Response(text, ids, lps, sampled_eot)

    def _append_response(self, resp: _Response, *, summary: bool) -> int:
        """Append generation prompt, response and turn end; returns the response's last policy position."""
        self._context_max = max(self._context_max, len(self._trace) + len(self.fmt.generation_prompt))
        self._trace.add(self.fmt.generation_prompt)
        self._trace.add(resp.ids, policy=True, summary=summary, log_probs=resp.log_probs)
        last = len(self._trace) - 1
        self._trace.add([] if resp.sampled_eot else [self.fmt.end_of_turn])
        self._trace.add(self.fmt.assistant_footer_rest)
        return last

    def _tool_turn(self, text: str) -> tuple[str, list[int], int]:
        """Clip a tool output to the cap (head + marker + tail, in tokens); returns text, turn ids, clipped."""
        if not isinstance(text, str):
            raise TypeError(f"ContextBudget needs text observations from the inner env, got {type(text).__name__}")
        text = valid_unicode(text)
        ids = self.fmt.encode(text)
        clipped = 0
        if len(ids) > self.config.tool_output_cap:
            text, ids, clipped = self._clip(text, ids)
        t = self.fmt.tool
        return text, [*t.header, *ids, *t.footer], clipped

    def _clip(self, text: str, ids: list[int]) -> tuple[str, list[int], int]:
        cap = self.config.tool_output_cap
        marker_len = len(self.fmt.encode(self.config.clip_marker.format(n=len(ids))))
        while True:
            keep = cap - marker_len
            head, tail = _whole_chars(self.fmt, text, ids, keep - keep // 2, keep // 2)
            n = len(ids) - head - tail
            marker = self.config.clip_marker.format(n=n)
            marker_ids = self.fmt.encode(marker)
            if head + len(marker_ids) + tail <= cap:
                break
            marker_len = len(marker_ids) + 1
        head_ids, tail_ids = ids[:head], ids[len(ids) - tail :]
        clipped_text = self.fmt.decode(head_ids) + marker + self.fmt.decode(tail_ids)
        return clipped_text, [*head_ids, *marker_ids, *tail_ids], n

    def _fits(self, prompt_len: int, *, soft: bool) -> bool:
        need = prompt_len + self.config.reserve + (self._summary_room if soft else 0)
        return need <= self.config.budget

    def _check_clip_marker(self) -> None:
        marker = len(self.fmt.encode(self.config.clip_marker.format(n=10**9)))
        if self.config.tool_output_cap < marker + 2:
            raise ValueError(
                f"tool_output_cap: expected at least {marker + 2} tokens (the clip marker is {marker}), "
                f"got {self.config.tool_output_cap}"
            )

    def _check_fits(self, system: str, task: str, *, where: str) -> None:
        """The start of every trace must leave room for a response (and a summary while compactions remain)."""
        c, f = self.config, self.fmt
        start = len(f.prefix(system, task)) + len(f.generation_prompt)
        if c.max_compactions > 0:
            start += (len(f.user.header) + len(self._summary_header_ids) + c.summary_tokens + len(f.user.footer)
                      + len(f.tool.header) + c.tool_output_cap + len(f.tool.footer))
        if not self._fits(start, soft=c.max_compactions > 0):
            room = self._summary_room if c.max_compactions > 0 else 0
            raise ValueError(
                f"budget: expected at least {start + c.reserve + room} tokens at {where} (system + task "
                f"{len(f.prefix(system, task))}, largest summary {c.summary_tokens}, tool_output_cap "
                f"{c.tool_output_cap}, reserve {c.reserve}, room for a summary request {room}), got {c.budget}"
            )

    # -- observation and info ------------------------------------------------------------------------

    def _system_prompt(self) -> str:
        system = getattr(self.env.unwrapped, "system_prompt", None)
        if not isinstance(system, str):
            raise ValueError(
                f"env: ContextBudget needs the inner env to expose a str `system_prompt`, got {system!r}"
            )
        return system

    def _observation(self) -> tuple[dict[str, str], ...]:
        # Gymnasium wants new objects in every observation (check_env checks): copies of the kept
        # dicts, which never leave the wrapper (half the cost of building each dict anew)
        return tuple(map(dict.copy, self._messages))

    def _info(self, inner_info: dict[str, Any], **extra: Any) -> dict[str, Any]:
        # a view of the trace's ids as they are now (the list only grows): no O(context) copy per step
        prompt = PromptIds(self._trace.ids, len(self._trace.ids), self.fmt.generation_prompt)
        return {
            **inner_info,
            "task_id": self._task_id,
            "context_tokens": len(prompt),
            "trace_index": self._trace_index,
            "compaction_required": self._compaction_required,
            "compacted": False,
            "prompt_token_ids": prompt,
            "max_new_tokens": self.config.summary_tokens if self._compaction_required else self.config.reserve,
            **extra,
        }


def _message(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def _whole_chars(fmt: ChatFormat, text: str, ids: list[int], head: int, tail: int) -> tuple[int, int]:
    """Shrink head/tail (by at most 4 ids each) so that neither splits a multi-byte character."""
    for _ in range(4):
        if head == 0 or text.startswith(fmt.decode(ids[:head])):
            break
        head -= 1
    for _ in range(4):
        if tail == 0 or text.endswith(fmt.decode(ids[len(ids) - tail :])):
            break
        tail -= 1
    return head, tail


def _messages_space(env: gym.Env, config: ContextBudgetConfig) -> ChatMessages:
    inner = [getattr(env.observation_space, "max_length", 0), getattr(env.action_space, "max_length", 0)]
    content_max = max([*inner, 1 << 20]) + len(config.summary_header) + len(config.clip_marker) + 32
    return ChatMessages(content_max)
