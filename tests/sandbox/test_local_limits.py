"""A sandbox limit a test run hits is named in its verdict even when the tests print no error: a private
tmpfs filled by a subprocess whose stderr the tests discard (large-file-upload-process: its uploader's
`no space left on device` never reached the pytest output) is seen full while the tests run."""

from __future__ import annotations

import pytest
from sandbox_helpers import local_unavailable, small_task

from compactrl.sandbox.local import LocalSandbox

# the write fails with ENOSPC, silently; the file stays a moment (a test's assertion, then its cleanup)
FILL = "head -c 64M /dev/zero > /tmp/big 2>/dev/null; rc=$?; sleep 0.3; rm -f /tmp/big; exit $(( rc != 0 ))"


@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
def test_a_tmpfs_filled_silently_is_named_in_the_verdict() -> None:
    sb = LocalSandbox(timeout_s=60, tmpfs_bytes=16 << 20)
    try:
        sb.start(small_task(kind="script", command=FILL))
        report = sb.run_tests()
        assert not report.success and "No space left" not in report.log_tail
        assert report.limit_hit == ("private tmpfs full: /tmp was full while the tests ran (/tmp 16 MiB: tmpfs_bytes; "
                                    "other writable folders 256 MiB each: writable_bytes)")
        # the same write within the limit: passes, and no limit is named
        ok = sb.run_tests(small_task(kind="script", command=FILL.replace("64M", "4M")).check)
        assert ok.success and ok.limit_hit is None
    finally:
        sb.close()
