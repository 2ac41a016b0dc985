"""nxd's warnings print as one line on the command line (no ``file:line:`` and no source line of
nxd's code, which read like a traceback); other libraries' warnings keep Python's format."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_nxd_warnings_are_one_line_and_others_keep_their_format(tmp_path) -> None:
    code = textwrap.dedent("""
        import warnings
        from nxd import warning_lines
        warning_lines.install()
        warning_lines.install()  # idempotent
        warnings.warn_explicit("newest names 'a', which does not exist", UserWarning,
                               "/x/site-packages/nxd_ckpt/checkpointer.py", 174)
        warnings.warn_explicit("plugin 'acme' was skipped", UserWarning, "/x/src/nxd/plugins.py", 245)
        warnings.warn_explicit("torch says", UserWarning, "/x/site-packages/torch/nn/modules.py", 9)
    """)
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stderr
    # only the lines these warnings produce count: the environment may add import-time warnings
    # of its own (torch without numpy)
    assert [line for line in err.splitlines() if line.startswith("nxd:")] == [
        "nxd: UserWarning: newest names 'a', which does not exist", "nxd: UserWarning: plugin 'acme' was skipped"], err
    assert "checkpointer.py:174" not in err and "plugins.py:245" not in err, err
    assert "/x/site-packages/torch/nn/modules.py:9: UserWarning: torch says" in err
