"""SIGTERM and SIGHUP to `nxd train` (a scheduler's stop) end like Ctrl-C: torchrun's SignalException
traceback goes to the run's interrupted.log, the exit code is 128 + the signal, and the last line says
the job was stopped (it blamed a rank: "rank 0 failed first: it exited with code 0 ... without
finishing"). A stand-in for torchrun keeps this test free of launches; test_launch_faults.py sends
SIGTERM to a real one."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# what torchrun does on these signals: raise (a traceback on stderr) and exit 1
FAKE_TORCHRUN = """
import signal, sys, time
def stop(signum, frame):
    raise RuntimeError(f"SignalException: Process got signal: {signum}")
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, stop)
print("agent up", file=sys.stderr, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_job_exits_128_plus_the_signal_with_torchruns_traceback_kept_aside(tmp_path: Path, sig) -> None:
    code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from nxd_training.launcher import run_forwarding_signals
        code, tail = run_forwarding_signals([sys.executable, "-c", {FAKE_TORCHRUN!r}], dict(os.environ),
                                            Path({str(tmp_path / 'interrupted.log')!r}), with_tail=True)
        print("code", code, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr.readline().strip() == "agent up"  # relayed while the job runs
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert out.strip() == f"code {128 + sig}", (out, err)
    assert "Traceback" not in err and "SignalException" in (tmp_path / "interrupted.log").read_text()


def test_the_stopped_line_names_the_signal(make_config, tmp_path: Path, monkeypatch) -> None:
    from nxd_training import rank_status
    from nxd_training.config import load_config
    from nxd_training.interrupt import stopped_message

    # a run that trained in this process before (another test) left its own count there
    monkeypatch.setitem(rank_status.progress, "done", None)

    config = load_config(make_config(exp_manager={"resume_if_exists": True})).exp_manager
    assert stopped_message(config, tmp_path, "SIGTERM").startswith(
        "nxd train: stopped by SIGTERM at step 0; no complete checkpoint yet, so a rerun starts over: nxd train ")
    assert stopped_message(config, tmp_path).startswith("nxd train: stopped at step 0; ")
