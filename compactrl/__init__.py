"""compactrl: Gymnasium environments and TorchRL-based RL for LLM agents that compact their context.

Importing the package registers the Gymnasium ids (``CompactCode-v0``, ``CompactTerminal-v0``).
"""

__version__ = "0.1.0"

from compactrl import registration as _registration  # noqa: E402,F401  (registers env ids)
