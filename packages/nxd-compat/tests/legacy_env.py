"""The environment NxD's examples were written for, layered over the test environment.

NxD's Llama examples pin ``transformers==4.48.0`` and ``datasets<=3.6.0`` (their requirements.txt,
vendored beside them); transformers 5 removed names they import. Like a migrating user who runs
``pip install -r requirements.txt``, the tests build a venv holding just those pins (and the
tokenizers / huggingface-hub / fsspec versions they need) whose ``.pth`` puts the test
environment's site-packages (torch, nxd, nxd-compat) after its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

#: The examples' pins (requirements.txt) and the versions those pins need.
LEGACY_PINS = ("transformers==4.48.0", "datasets==3.6.0", "tokenizers>=0.21,<0.22", "huggingface-hub>=0.24,<1.0",
               "fsspec[http]>=2023.1.0,<=2025.3.0",
               # the fine-tuning example scores with torchmetrics' ROUGE (torchmetrics comes with Lightning), which
               # needs nltk ("Need to run ... nltk.download('punkt')", its evaluate())
               "nltk==3.10.4", "joblib==1.6.0")
#: NxD's GPT-NeoX and BERT examples pin transformers 4.26 (their requirements.txt)
NEOX_PINS = ("transformers==4.26.0", "datasets==3.6.0", "tokenizers>=0.11,<0.14", "huggingface-hub>=0.11,<0.25",
             "fsspec[http]>=2023.1.0,<=2025.3.0")
#: NxD's BERT example reads its pretraining data from HDF5 files (requirements.txt: h5py)
BERT_PINS = (*NEOX_PINS, "h5py>=3.10")
REPO = Path(__file__).resolve().parents[3]


def find_uv() -> str:
    for candidate in (os.environ.get("UV"), shutil.which("uv"), str(REPO / ".tools" / "bin" / "uv")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise RuntimeError("building the NxD examples' environment needs uv: run `source scripts/bootstrap-tools.sh` "
                       "or put uv on PATH")


def build(root: Path, pins: tuple[str, ...] = LEGACY_PINS) -> Path:
    """Create the layered venv under ``root`` holding ``pins``; return its python."""
    uv = find_uv()
    venv = root / "nxd-examples-env"
    subprocess.run([uv, "venv", "-q", str(venv), "--python", os.sys.executable], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    parent = sysconfig.get_paths()["purelib"]
    Path(purelib, "_nxd_test_env.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    subprocess.run([uv, "pip", "install", "-q", "--python", str(python), "--no-deps", *pins], check=True)
    return python
