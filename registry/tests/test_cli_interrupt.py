"""Ctrl-C while `nxd` is still importing or validating (minutes on a loaded host, before any
command handles it) ends with one line and exit code 130, never a KeyboardInterrupt traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time


def test_ctrl_c_before_a_command_runs_is_one_line(tmp_path) -> None:
    # the parser is built from plugins' imports: stand in for a slow one with a sleep there
    code = textwrap.dedent("""
        import sys, time
        import nxd.cli as cli
        def slow_parser(verb):
            print("building", flush=True)
            time.sleep(60)
        cli.build_parser = slow_parser
        sys.exit(cli.main(["plugins"]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "building"
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    # only nxd's own output counts: the environment may add import-time warnings (torch without numpy)
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "nxd: interrupted", err
    assert [line for line in err.splitlines() if line.startswith("nxd")] == ["nxd: interrupted"], err
