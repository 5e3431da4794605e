"""Collectors: run many context-budget envs with batched generation and yield trace batches."""

from compactrl.collectors.batch import EpisodeMeta, concat_traces, stack_traces
from compactrl.collectors.trace_collector import EpisodeStats, TraceCollector, summarize_episodes

__all__ = ["EpisodeMeta", "EpisodeStats", "TraceCollector", "concat_traces", "stack_traces", "summarize_episodes"]
