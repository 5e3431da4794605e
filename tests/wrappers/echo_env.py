"""A small text env with the CodeRepoEnv API, for testing the context-budget wrapper in isolation.

Observation after ``reset``: a task text; after ``step``: a tool output of random length (up to
``max_output_chars``, often longer than a tool-output cap) that starts by echoing the action's
length. ``SUBMIT`` in an action terminates with reward 1.0; ``REWARD`` in an action earns 0.25;
``max_turns`` inner steps truncate. Deterministic given the reset seed and the actions.
"""

from __future__ import annotations

import gymnasium as gym

from compactrl.envs.spaces import UnicodeText

WORDS = ("def", "return", "value", "config", " ", "\n", "    ", "_", "(", ")", ":", "42", "é", "中文", "🔥", "<|im_end|>", "x")


class EchoEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_turns: int = 30, max_output_chars: int = 1500, task_words: int = 30,
                 system_prompt: str = "You are a coding agent. Use one tool per turn."):
        self.max_turns = max_turns
        self.max_output_chars = max_output_chars
        self.task_words = task_words
        self.system_prompt = system_prompt
        self.observation_space = UnicodeText(1 << 16)
        self.action_space = UnicodeText(1 << 16)
        self.task = None

    def _words(self, n: int) -> str:
        return "".join(WORDS[i] for i in self.np_random.integers(0, len(WORDS), n))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        self.task = f"task-{int(self.np_random.integers(1 << 30))}"
        return f"Fix the bug ({self.task}): " + self._words(self.task_words), {"task_id": self.task}

    def step(self, action):
        self.turn += 1
        if "SUBMIT" in action:
            return "submitted", 1.0, True, False, {"success": True}
        n = int(self.np_random.integers(0, self.max_output_chars + 1))
        out = f"echo[{len(action)}] " + self._words(n // 3)[:n]
        reward = 0.25 if "REWARD" in action else 0.0
        return out, reward, False, self.turn >= self.max_turns, {"success": False}
