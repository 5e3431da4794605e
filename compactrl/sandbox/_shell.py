"""What the real backends (local, docker) share: the bash text that runs one agent command, the
output cap, and turning raw bytes into a readable observation.

Shell semantics, identical on both backends: every command runs as ``bash -c COMMAND`` in a fresh
process (so ``exit``, ``set -e`` or an endless builtin loop cannot take the sandbox's own shell
down); its working directory and exported variables are saved when it ends and restored for the
next command (plain shell variables, functions and options are not kept); when it ends (or times
out) every process it started is killed, background jobs included.
"""

from __future__ import annotations

import re
import secrets

STATE_PATH = "/tmp/.compactrl_state"
"""Where a command's cwd and exported variables are kept for the next command (inside the sandbox)."""

ENV_FILE_PATH = "/opt/compactrl/env.sh"
"""Where :data:`ENV_FILE` lives inside the sandbox; bash reads it through ``BASH_ENV``."""

TIMEOUT_EXIT_CODE = 124
"""Exit code reported for a command killed by the timeout (as GNU ``timeout`` does)."""

# Sourced by the `bash -c COMMAND` of every command (via BASH_ENV, so COMMAND's own text, line
# numbers and $0 are exactly those of `bash -c`), which starts with an empty environment: restore
# the previous command's cwd and exported variables (or the sandbox's initial ones), and save them
# again on the way out.
ENV_FILE = f"""unset BASH_ENV
for __crl_f in {STATE_PATH} {STATE_PATH}.initial; do
  if [ -r "$__crl_f" ]; then . "$__crl_f" >/dev/null 2>&1; break; fi
done
unset __crl_f
trap '__crl_rc=$?; {{ export -p; printf "cd -- %q\\n" "$PWD"; }} > {STATE_PATH} 2>/dev/null; exit $__crl_rc' EXIT
"""

RUN_COMMAND = f'BASH_ENV={ENV_FILE_PATH} bash --noprofile --norc -c "$__crl_cmd" </dev/null 2>&1'
"""Bash text that runs the agent's command held in ``$__crl_cmd``. The calling shell exports
nothing else, so the command's environment is exactly the restored one; ``bash`` is found on the
caller's fixed PATH, so ``$0`` and error messages read ``bash:`` as in ``bash -c``."""

SAVE_INITIAL_STATE = (
    f'{{ export -p; printf "cd -- %q\\n" "$PWD"; }} > {STATE_PATH} && cp {STATE_PATH} {STATE_PATH}.initial'
)
"""Bash text that writes the state (cwd and exported variables) a fresh sandbox starts from."""

# Kill every process the command left behind: `kill -1` spares only the caller and the pid
# namespace's init, and repeating it catches children forked while the first pass ran.
KILL_LEFTOVERS = "for __crl_i in 1 2 3 4 5 6 7 8; do kill -9 -1 2>/dev/null || break; done"

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def new_marker() -> str:
    """A random end-of-command marker; agent output cannot guess it."""
    return f"__compactrl_done_{secrets.token_hex(16)}_"


def ansi_c_quote(text: str) -> str:
    """``text`` as a bash ``$'...'`` word that survives any content (quotes, newlines, unicode).

    NUL cannot occur in a bash string and is dropped.
    """
    out = []
    for b in text.encode("utf-8", errors="surrogatepass"):
        if b == 0:
            continue
        c = chr(b)
        out.append(c if (0x20 <= b < 0x7F and c not in "'\\") else f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


def readable(data: bytes) -> str:
    """Bytes as text for a model: invalid UTF-8 and control characters (except tab, newline and
    carriage return) become U+FFFD, so binary output is an observation, never an error."""
    return _CONTROL.sub("\ufffd", data.decode("utf-8", errors="replace"))


class CappedOutput:
    """Collects a byte stream but keeps only its first ``limit // 2`` and last ``limit - limit // 2``
    bytes, so a command printing 100 MB costs bounded memory. ``total`` counts every byte seen."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_limit + 65536:  # trim rarely: amortised O(1) per byte
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def truncated(self) -> bool:
        return self.total > self.head_limit + self.tail_limit

    def text(self) -> str:
        """The kept bytes as readable text, with a marker where the middle was dropped."""
        tail = bytes(self.tail[len(self.tail) - self.tail_limit :]) if self.tail_limit else b""
        if not self.truncated:
            return readable(bytes(self.head) + bytes(self.tail))
        omitted = self.total - len(self.head) - len(tail)
        return readable(bytes(self.head)) + f"\n[... {omitted} bytes of output omitted ...]\n" + readable(tail)


class MarkerScanner:
    """Feeds a stream into a :class:`CappedOutput` until ``marker`` followed by an exit code and a
    newline arrives; bytes after that line are kept in ``rest`` for the next command."""

    def __init__(self, marker: bytes, out: CappedOutput) -> None:
        self.marker = marker
        self.out = out
        self.pending = b""
        self.exit_code: int | None = None
        self.rest = b""

    def feed(self, chunk: bytes) -> bool:
        """Consume ``chunk``; True once the marker line is complete."""
        buf = self.pending + chunk
        i = buf.find(self.marker)
        if i < 0:
            keep = len(self.marker) - 1
            self.out.feed(buf[: max(0, len(buf) - keep)])
            self.pending = buf[max(0, len(buf) - keep) :]
            return False
        j = buf.find(b"\n", i)
        if j < 0:  # the code has not fully arrived yet
            self.out.feed(buf[:i])
            self.pending = buf[i:]
            return False
        self.out.feed(buf[:i])
        code = buf[i + len(self.marker) : j].strip()
        self.exit_code = int(code) if code.lstrip(b"-").isdigit() else -1
        self.rest = buf[j + 1 :]
        self.pending = b""
        return True

    def flush(self) -> None:
        """The stream ended without the marker: keep what was held back."""
        self.out.feed(self.pending)
        self.pending = b""
