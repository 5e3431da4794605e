"""OpenAI-compatible recording gateway for black-box agents, and trace reconstruction.

* :mod:`.app` — ``compactrl gateway`` / :class:`Gateway`: chat and text completions in front of an
  in-process policy or an upstream engine, every call recorded per session;
* :mod:`.chat` — request models, the tool-call format, exact prompt ids;
* :mod:`.recording` — session files (bounded memory, atomic finish);
* :mod:`.traces` — recorded sessions -> trace trees -> the trace batch;
* :mod:`.mini_swe` — mini-swe-agent (unmodified, offline) on CompactCode tasks through the gateway;
* :mod:`.collector` — those episodes as a rollout source with the trace collector's API
  (``compactrl train --rollout.source mini_swe_agent``).
"""

from compactrl.gateway.app import Gateway, GatewayConfig
from compactrl.gateway.engines import LocalEngine, UpstreamEngine
from compactrl.gateway.recording import CallRecord, Recorder, Session, load_session

__all__ = ["CallRecord", "Gateway", "GatewayConfig", "LocalEngine", "Recorder", "Session", "UpstreamEngine",
           "load_session"]
