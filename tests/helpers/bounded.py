"""Run the `pawfn` CLI in a child process and measure what it cost: exit status, output, seconds and peak RSS."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

__all__ = ["PEAK_RSS_MB", "SECONDS", "CliRun", "run_cli"]

# a CLI process that imports torch and loads a tiny program stays far below these; the damage the hostile-file
# tests guard against grew past 2 GB within seconds
SECONDS, PEAK_RSS_MB = 60.0, 1500.0


@dataclass(frozen=True)
class CliRun:
    """One finished `pawfn` process."""

    status: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss_mb: float

    def assert_one_line_error(self, status: int, *fragments: str) -> None:
        """Exit `status`, nothing on stdout, one `pawfn: error:` line holding every fragment, no traceback, within
        `SECONDS` and `PEAK_RSS_MB`."""
        self.assert_within(SECONDS, PEAK_RSS_MB)
        assert self.status == status, self.stderr
        assert self.stdout == ""
        assert self.stderr.count("\n") == 1 and self.stderr.startswith("pawfn: error: "), self.stderr
        assert "Traceback" not in self.stderr
        for fragment in fragments:
            assert fragment in self.stderr, self.stderr

    def assert_within(self, seconds: float, peak_rss_mb: float) -> None:
        """The process ended within `seconds` and never held more than `peak_rss_mb` of memory."""
        assert self.seconds < seconds, f"took {self.seconds:.1f} s"
        assert self.peak_rss_mb < peak_rss_mb, f"peak RSS {self.peak_rss_mb:.0f} MB"


def run_cli(*arguments: str | bytes, timeout_s: float = 120.0, environment: dict[str, str] | None = None) -> CliRun:
    """`python -m pawfn ARGUMENTS` to its end (killed past `timeout_s`), with `environment` added to this process's;
    `wait4` gives this child's own peak RSS."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "pawfn", *arguments], stdout=out, stderr=err, text=True, env={**os.environ, **(environment or {})}
        )
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - started > timeout_s:
                process.kill()
                os.wait4(process.pid, 0)
                process.returncode = -9
                raise AssertionError(f"pawfn {arguments!r} ran past {timeout_s} s")
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        out.seek(0)
        err.seek(0)
        return CliRun(process.returncode, out.read(), err.read(), seconds, usage.ru_maxrss / 1024)
