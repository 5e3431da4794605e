"""Collectors: run many context-budget envs with batched generation and yield trace batches."""

from compactrl.collectors.batch import EpisodeMeta, concat_traces, stack_traces
from compactrl.collectors.episodes import EpisodeStats, summarize_episodes
from compactrl.collectors.trace_collector import TraceCollector

__all__ = ["EpisodeMeta", "EpisodeStats", "TraceCollector", "concat_traces", "stack_traces", "summarize_episodes"]
