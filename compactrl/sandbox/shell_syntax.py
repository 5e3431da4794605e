"""Shell syntax that the sandboxes and the task sets both read (public: the task sets parse Dockerfiles and
reference solutions with it)."""

from __future__ import annotations

import re

HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
"""A here-document's start in shell text (and in a Dockerfile's, BuildKit's syntax): ``<<WORD``,
``<<-WORD``, ``<< 'WORD'``, ``<<"WORD"``; groups: ``-`` (leading tabs stripped), the quote, the word.
Not the here-string ``<<<``."""
