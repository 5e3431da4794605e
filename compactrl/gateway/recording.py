"""Recording of every gateway call, per session, on disk.

A session (an episode of a black-box agent) is named by the path segment ``/s/<session>/v1/...`` or
the header ``X-Session-Id``. Each call becomes one :class:`CallRecord`: the exact prompt ids the
model saw, the sampled ids and their log-probs per choice, the policy version, the agent (a
conversation root, or the ``X-Agent-Id`` header) and timings.

Memory stays bounded: records wait in a per-session buffer of at most ``max_buffered`` entries and
are then appended, one JSON line per record in a single ``write``, to ``<dir>/<session>.jsonl.part``
(a crash leaves at most a torn last line, which :func:`load_session` skips). Ending a session
(:meth:`Recorder.finish`, e.g. ``POST /v1/sessions/<session>/reward``) appends the outcome line,
fsyncs and renames the file to ``<session>.jsonl``: a finished session appears whole or not at all.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass
class SampledChoice:
    """One sampled continuation: ids (a sampled end-of-turn id last when ``finished``) and log-probs."""

    token_ids: list[int]
    log_probs: list[float]
    finished: bool
    routed_experts: str | None = None
    """MoE routes of the prompt and these ids (``[prompt + ids, layers, k]``) as the sampler chose them,
    encoded by :func:`compactrl.policies.routing.encode_routes`; None when the engine records none."""


@dataclass
class CallRecord:
    """One model call as the gateway served it."""

    session: str
    index: int
    """Arrival order within the session (0, 1, ...)."""
    agent: str
    """Which conversation the call belongs to: ``X-Agent-Id``, else a hash of its first two turns."""
    parent_agent: str | None
    """``X-Parent-Agent-Id`` when the client names the agent that spawned this one."""
    prompt_ids: list[int]
    choices: list[SampledChoice]
    policy_version: int
    model: str
    route: str
    """``chat`` or ``completions``."""
    t_received: float
    """Wall-clock (``time.time()``) when the request arrived."""
    queue_s: float = 0.0
    """Seconds from arrival until its prompt ids were ready and it was handed to the engine."""
    generate_s: float = 0.0
    """Seconds the engine took (waiting in its batch queue included)."""
    sampling: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"type": "call", **asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> CallRecord:
        d = {k: v for k, v in d.items() if k != "type"}
        d["choices"] = [SampledChoice(**c) for c in d["choices"]]
        return cls(**d)


@dataclass
class Session:
    """A session read back: its calls in arrival order and its outcome (None while unfinished)."""

    name: str
    calls: list[CallRecord]
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.reward is not None


def check_session(name: str) -> str:
    if not SESSION_RE.match(name):
        raise ValueError(f"session: expected 1-128 characters of [A-Za-z0-9._-] not starting with "
                         f"'.', '_' or '-', got {name[:40]!r}")
    return name


class Recorder:
    """Thread-safe per-session recorder writing under ``directory`` (see the module doc)."""

    def __init__(self, directory: str | Path, *, max_buffered: int = 64, max_open_sessions: int = 4096) -> None:
        if max_buffered < 1 or max_open_sessions < 1:
            raise ValueError(f"max_buffered and max_open_sessions must be >= 1, got {max_buffered}, "
                             f"{max_open_sessions}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_buffered, self.max_open_sessions = max_buffered, max_open_sessions
        self._lock = threading.Lock()
        self._buffers: OrderedDict[str, list[str]] = OrderedDict()
        self._counts: dict[str, int] = {}

    def part_path(self, session: str) -> Path:
        return self.directory / f"{session}.jsonl.part"

    def path(self, session: str) -> Path:
        return self.directory / f"{session}.jsonl"

    def next_index(self, session: str) -> int:
        """Reserve the next call index of ``session`` (arrival order)."""
        with self._lock:
            if self.path(session).exists():
                raise ValueError(f"session {session!r} is finished; start a new session")
            n = self._counts.get(session, 0)
            self._counts[session] = n + 1
            return n

    def record(self, rec: CallRecord) -> None:
        with self._lock:
            buf = self._buffers.setdefault(rec.session, [])
            self._buffers.move_to_end(rec.session)
            buf.append(rec.to_json())
            if len(buf) >= self.max_buffered:
                self._flush(rec.session)
            while len(self._buffers) > self.max_open_sessions:  # idle sessions go to disk first
                self._flush(next(iter(self._buffers)))

    def _flush(self, session: str) -> None:
        lines = self._buffers.pop(session, [])
        if lines:
            _append(self.part_path(session), "".join(line + "\n" for line in lines))

    def flush(self) -> None:
        with self._lock:
            for session in list(self._buffers):
                self._flush(session)

    def finish(self, session: str, reward: float, info: dict[str, Any] | None = None) -> Path:
        """End ``session`` with its outcome; the file becomes ``<session>.jsonl`` atomically."""
        with self._lock:
            final = self.path(session)
            if final.exists():
                raise ValueError(f"session {session!r} is already finished")
            self._flush(session)
            part = self.part_path(session)
            _append(part, json.dumps({"type": "end", "reward": float(reward), "info": info or {}}) + "\n", sync=True)
            os.replace(part, final)
            self._counts.pop(session, None)
            return final

    def finished_sessions(self) -> list[Path]:
        return sorted(self.directory.glob("*.jsonl"))


def _append(path: Path, text: str, *, sync: bool = False) -> None:
    """One ``write`` of whole lines; a torn line left by a crash is closed first so it stays alone."""
    with open(path, "a+b") as f:
        if f.tell() and (f.seek(f.tell() - 1), f.read(1))[1] != b"\n":
            text = "\n" + text
        f.write(text.encode("utf-8"))
        if sync:
            f.flush()
            os.fsync(f.fileno())


def load_session(path: str | Path) -> Session:
    """Read a session file (finished ``.jsonl`` or open ``.jsonl.part``; a torn last line is skipped)."""
    path = Path(path)
    name = path.name.split(".jsonl")[0]
    calls, reward, info = [], None, {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a crashed writer
        if d.get("type") == "end":
            reward, info = float(d["reward"]), d.get("info", {})
        elif d.get("type") == "call":
            calls.append(CallRecord.from_dict(d))
    calls.sort(key=lambda c: c.index)
    return Session(name, calls, reward, info)
