"""Programs that start their user's shell work in the local sandbox: the sandbox user (``nobody`` when
compactrl runs as root) has ``nologin`` as its login shell, so ``SHELL`` names bash, as an image's root
has it. tmux's panes are such shells (tmux-advanced-workflow's reference solution drives three panes
with ``tmux send-keys``; with nologin each pane exited at once and the server with it)."""

from __future__ import annotations

import shutil

import pytest
from sandbox_helpers import local_unavailable, small_task

from compactrl.sandbox.local import LocalSandbox


@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
def test_shell_names_bash() -> None:
    sb = LocalSandbox(timeout_s=60)
    try:
        sb.start(small_task())
        assert sb.exec("echo $SHELL").output.strip() == "/bin/bash"
    finally:
        sb.close()


def _isolation_ok(kind: str) -> bool:
    from compactrl.sandbox.base import SandboxError
    from compactrl.sandbox.local import choose_isolation

    try:
        return choose_isolation(kind) == kind
    except SandboxError:
        return False


@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed here")
@pytest.mark.parametrize("isolation", ["bwrap", "unshare"])
def test_a_tmux_pane_runs_what_is_sent_to_it(isolation) -> None:
    # pseudo-terminals: bubblewrap's --dev has its own devpts; the unshare script mounts one (a task with a
    # root layer isolates with unshare)
    if not _isolation_ok(isolation):
        pytest.skip(f"{isolation} isolation is not available here")
    sb = LocalSandbox(timeout_s=60, keep_background=True, isolation=isolation)
    try:
        sb.start(small_task())
        assert sb.exec("tmux new-session -d -s w -x 80 -y 24 && tmux split-window -v -t w").exit_code == 0
        sb.exec("tmux send-keys -t w:0.1 'echo from-the-pane > pane.txt' C-m")
        out = sb.exec("for i in $(seq 100); do [ -s pane.txt ] && break; sleep 0.1; done; cat pane.txt").output
        assert out.strip() == "from-the-pane"
    finally:
        sb.close()
