"""What the asynchronous-rollout tests share (in process and on Ray): a policy that takes a random,
heavy-tailed time to answer, so workers and the learner interleave as they would with long episodes."""

from __future__ import annotations

import random
import time


class SlowPolicy:
    """Waits ``scale * Pareto(1.5)`` seconds (capped at ``20 * scale``, seeded) before ``inner`` acts; every
    other attribute (``load_state_dict``, ``sampling``, ...) is ``inner``'s."""

    def __init__(self, inner, seed: int, scale: float) -> None:
        self.inner, self.rng, self.scale = inner, random.Random(seed), scale

    def act(self, requests):
        time.sleep(min(self.scale * self.rng.paretovariate(1.5), 20 * self.scale))
        return self.inner.act(requests)

    def __getattr__(self, name):
        return getattr(self.inner, name)
