"""Wrappers: the context-budget wrapper (forced compaction, exact traces) and its chat-format helper."""

from compactrl.wrappers.chat_format import ChatFormat
from compactrl.wrappers.context_budget import ContextBudget, ContextBudgetConfig

__all__ = ["ChatFormat", "ContextBudget", "ContextBudgetConfig"]
