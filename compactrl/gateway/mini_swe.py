"""mini-swe-agent (from PyPI, unmodified) solving CompactCode tasks through the gateway, offline.

* The agent is mini-swe-agent's own ``DefaultAgent`` with its ``LitellmModel`` (``bash`` tool calls)
  and its packaged ``mini.yaml`` config, pointed at ``<gateway>/s/<session>/v1`` by litellm's
  ``api_base``. litellm runs offline (``LITELLM_OFFLINE_MODE``, ``LITELLM_LOCAL_MODEL_COST_MAP``) with
  cost tracking set to ignore errors (``MSWEA_COST_TRACKING``), silent startup and a private global
  config dir: :func:`offline_environment` sets these before mini-swe-agent is imported.
* :class:`SandboxEnvironment` implements mini-swe-agent's ``Environment`` protocol on a compactrl
  sandbox (``local``: bubblewrap or unshare; never the host shell), keeping its submit convention
  (first output line ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` ends the run).
* mini-swe-agent keeps its whole history; :class:`CompactingAgent` is the documented subclass that
  compacts it: when its messages exceed ``context_tokens`` (counted with the gateway's own chat
  format), it asks the model for a summary (a call that extends the current context) and restarts
  from system + task + summary, so the gateway records a new trace of the same conversation.
* :func:`run_episode` runs one task and ends the gateway session with the task's check, run on the
  agent's sandbox, as the reward.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

import requests

from compactrl.gateway.chat import ChatRequest, prompt_ids
from compactrl.sandbox import Sandbox
from compactrl.task import Task
from compactrl.wrappers.chat_format import ChatFormat

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SUMMARY_REQUEST = (
    "Your context is full. Write a short summary of what you learned and did so far (files, findings, "
    "edits, what is left); your history will be replaced by it."
)


def offline_environment(config_dir: str | None = None) -> None:
    """The environment variables mini-swe-agent and litellm need to run offline and quietly."""
    os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    if "MSWEA_GLOBAL_CONFIG_DIR" not in os.environ:  # its import writes there: never the user's own
        os.environ["MSWEA_GLOBAL_CONFIG_DIR"] = config_dir or tempfile.mkdtemp(prefix="mswea-config-")


class SandboxEnvironment:
    """mini-swe-agent's ``Environment`` on a started compactrl :class:`Sandbox`."""

    def __init__(self, sandbox: Sandbox, timeout_s: float = 30.0) -> None:
        self.sandbox, self.timeout_s = sandbox, timeout_s
        self.config = {"backend": sandbox.backend, "timeout_s": timeout_s}

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted

        command = action.get("command", "")
        res = self.sandbox.exec(f"cd {cwd} && {command}" if cwd else command, timeout_s=timeout or self.timeout_s)
        output = {"output": res.output, "returncode": res.exit_code,
                  "exception_info": "the command timed out" if res.timed_out else ""}
        lines = res.output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and res.exit_code == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return output

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        return {"system": "Linux", "release": "", "version": "", "machine": "", **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"environment": self.config,
                                    "environment_type": f"{type(self).__module__}.{type(self).__name__}"}}}


def _agent_class():
    offline_environment()
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.exceptions import FormatError

    class CompactingAgent(DefaultAgent):
        """``DefaultAgent`` that replaces its history by a summary when it exceeds ``context_tokens``."""

        def __init__(self, model, env, *, fmt: ChatFormat, context_tokens: int, **kwargs) -> None:
            super().__init__(model, env, **kwargs)
            self.fmt, self.context_tokens = fmt, context_tokens
            self.n_compactions = 0

        def context_size(self, messages: list[dict]) -> int:
            from minisweagent.models.utils.actions_toolcall import BASH_TOOL

            clean = [{k: v for k, v in m.items() if k != "extra"} for m in messages]
            return len(prompt_ids(self.fmt, ChatRequest(messages=clean, tools=[BASH_TOOL]), None))

        def query(self) -> dict:
            # compact only when the step limit leaves room for the summary and the call after it
            room = self.config.step_limit == 0 or self.n_calls + 2 <= self.config.step_limit
            if room and len(self.messages) > 2 and self.context_size(self.messages) > self.context_tokens:
                self.compact()
            return super().query()

        def compact(self) -> None:
            request = [*self.messages, {"role": "user", "content": SUMMARY_REQUEST}]
            self.n_calls += 1
            try:
                summary = self.model.query(request).get("content") or ""
            except FormatError as e:  # a summary without a tool call is what was asked for
                response = e.messages[0].get("extra", {}).get("response")
                summary = (response["choices"][0]["message"].get("content") or "") if isinstance(response, dict) else ""
            self.messages = [*self.messages[:2], {"role": "user", "content": f"Summary of your work so far:\n{summary}"}]
            self.n_compactions += 1

    return CompactingAgent


@dataclass(frozen=True)
class EpisodeResult:
    session: str
    reward: float
    exit_status: str
    calls: int
    compactions: int


def run_episode(gateway_url: str, model: str, session: str, task: Task, sandbox: Sandbox, fmt: ChatFormat, *,
                context_tokens: int, step_limit: int = 6, max_tokens: int = 48, temperature: float = 1.0,
                config_name: str = "mini.yaml", action_regex: str | None = None,
                command_timeout_s: float = 30.0) -> EpisodeResult:
    """One mini-swe-agent episode on ``task`` in a started ``sandbox``; the session ends with the check.

    ``config_name``: one of mini-swe-agent's packaged configs, ``mini.yaml`` (``bash`` tool calls) or
    ``default.yaml`` (text actions in a fenced block; its ``LitellmTextbasedModel``). ``action_regex``
    sets that text model's own ``action_regex`` option (e.g. a first-line regex, so that a model too
    small to write the fenced block still acts and its history grows as a real agent's does).
    """
    offline_environment()
    import litellm
    from minisweagent.config import get_config_from_spec
    from minisweagent.models import get_model

    litellm.suppress_debug_info = True  # its "Provider List" banner on every unpriced model

    config = get_config_from_spec(config_name)
    model_config = {**config.get("model", {}), "model_name": f"openai/{model}", "cost_tracking": "ignore_errors"}
    if config_name == "default.yaml":
        model_config["model_class"] = "litellm_textbased"
    if action_regex is not None:
        model_config["action_regex"] = action_regex
    model_config["model_kwargs"] = {**model_config.get("model_kwargs", {}), "api_base": f"{gateway_url}/s/{session}/v1",
                                    "api_key": "none", "max_tokens": max_tokens, "temperature": temperature,
                                    "num_retries": 0}
    agent_config = {k: v for k, v in config["agent"].items() if k in ("system_template", "instance_template")}
    env = SandboxEnvironment(sandbox, timeout_s=command_timeout_s)
    agent = _agent_class()(get_model(config=model_config), env, fmt=fmt,
                           context_tokens=context_tokens, step_limit=step_limit, cost_limit=0.0,
                           max_consecutive_format_errors=0, **agent_config)
    result = agent.run(task.instruction)
    reward = 1.0 if sandbox.run_tests().success else 0.0
    resp = requests.post(f"{gateway_url}/v1/sessions/{session}/reward", timeout=30,
                         json={"reward": reward, "info": {"task": task.id, "exit_status": result.get("exit_status")}})
    resp.raise_for_status()
    return EpisodeResult(session, reward, str(result.get("exit_status", "")), agent.n_calls, agent.n_compactions)
