"""Issue 43's fault battery: hostile paths and damaged files through the real CLI (and the DCP API).

Each case prepares a folder, runs one command the way a user would, and prints a markdown row:
the case, the exit code, seconds to exit, whether anything outside the run was written/read, and
the last line the user saw. Run it with the Python of the tree to test (before/after a change):

    python benchmarks/integrity_battery.py [--python .venv/bin/python] [--work DIR] [--only NAME ...]

ENOSPC cases mount a 1 MiB tmpfs (needs root; skipped otherwise). Not part of the test suite (each
case starts a fresh interpreter); the tests that hold each fix are named in docs/checkpoints.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

SETUP_NXD = """
import nxd, torch, os
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.fc = torch.nn.Linear(64, 64)
for tag in TAGS:
    nxd.save_checkpoint(ROOT, tag, model=Net(), user_content={"tag": tag})
"""

SETUP_HF = """
import torch, transformers
cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
transformers.LlamaForCausalLM(cfg).save_pretrained(OUT, safe_serialization=True, max_shard_size="20KB")
"""

DCP_SAVE = """
import os, tempfile, torch, torch.distributed as dist
d = tempfile.mkdtemp()
dist.init_process_group("gloo", store=dist.FileStore(os.path.join(d, "s"), 1), rank=0, world_size=1)
from nxd_fsdp.dcp import save_dcp, load_dcp
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
"""


def py(python: str, code: str, **names: str) -> subprocess.CompletedProcess:
    head = "".join(f"{k} = {v!r}\n" for k, v in names.items())
    return subprocess.run([python, "-c", head + textwrap.dedent(code)], capture_output=True, text=True)


def nxd_cli(python: str, *argv: str) -> tuple[subprocess.CompletedProcess, float]:
    code = "import sys; from nxd.cli import main; sys.exit(main())"
    t0 = time.perf_counter()
    out = subprocess.run([python, "-c", code, *argv], capture_output=True, text=True)
    return out, time.perf_counter() - t0


def last_line(out: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (out.stderr + out.stdout).splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def case_verify_tag_escape(python: str, w: str) -> tuple:
    py(python, SETUP_NXD, ROOT=f"{w}/run/checkpoints", TAGS=["a"])
    py(python, SETUP_NXD + "os.remove(os.path.join(ROOT, 'c', 'done'))", ROOT=f"{w}/x", TAGS=["c"])
    out, s = nxd_cli(python, "ckpt", "verify", f"{w}/run/checkpoints", "--tag", "../../x/c", "--mark-done")
    return out, s, f"wrote outside: {os.path.exists(f'{w}/x/c/done')}"


def case_convert_tag_escape(python: str, w: str) -> tuple:
    py(python, SETUP_NXD, ROOT=f"{w}/run/checkpoints", TAGS=["a"])
    py(python, SETUP_NXD, ROOT=f"{w}/x", TAGS=["c"])
    out, s = nxd_cli(python, "ckpt", "convert", "--from", "nxd", "--to", "full", "--input", f"{w}/run/checkpoints",
                     "--tag", "../../x/c", "--output", f"{w}/o.pt")
    return out, s, f"read outside: {os.path.exists(f'{w}/o.pt')}"


def case_linked_tag_retention(python: str, w: str) -> tuple:
    py(python, SETUP_NXD, ROOT=f"{w}/other", TAGS=["theirs"])
    t0 = time.perf_counter()
    out = py(python, """
        import nxd, torch, os, warnings
        nxd.save_checkpoint(ROOT, "a", model=torch.nn.Linear(4, 4))
        os.symlink(OTHER, os.path.join(ROOT, "linked"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for tag in ("b", "c", "d"):
                nxd.save_checkpoint(ROOT, tag, model=torch.nn.Linear(4, 4), num_kept_ckpts=1)
        print(len([w for w in caught if "linked" in str(w.message)]), "warnings;", str(caught[-1].message) if caught else "")
        """, ROOT=f"{w}/run", OTHER=f"{w}/other/theirs")
    s = time.perf_counter() - t0
    touched = not os.path.exists(f"{w}/other/theirs/done") or os.path.exists(f"{w}/other/theirs/retired")
    return out, s, f"outside checkpoint retired: {touched}"


def case_done_symlink(python: str, w: str) -> tuple:
    py(python, SETUP_NXD + "os.remove(os.path.join(ROOT, 'b', 'done')); "
       "os.symlink(os.path.join(ROOT, 'a', 'done'), os.path.join(ROOT, 'b', 'done'))", ROOT=f"{w}/c", TAGS=["a", "b"])
    out, s = nxd_cli(python, "ckpt", "inspect", f"{w}/c")
    return out, s, "inspected: " + ("a" if f"{w}/c/a" in out.stdout else "b" if f"{w}/c/b" in out.stdout else "-")


def case_newest_escape(python: str, w: str) -> tuple:
    py(python, SETUP_NXD + "open(os.path.join(ROOT, 'newest'), 'w').write('../../etc')", ROOT=f"{w}/c", TAGS=["a"])
    out, s = nxd_cli(python, "ckpt", "inspect", f"{w}/c")
    return out, s, ""


def _validate(python: str, w: str, override: str) -> tuple:
    out, s = nxd_cli(python, "train", "hub:quickstart", "--validate", override, f"exp_manager.exp_dir={w}/exp")
    return out, s, ""


def case_filename_escape(python: str, w: str) -> tuple:
    return _validate(python, w, "exp_manager.checkpoint_callback_params.filename=../../escaped")


def case_name_escape(python: str, w: str) -> tuple:
    return _validate(python, w, "exp_manager.name=../../x")


def case_name_absolute(python: str, w: str) -> tuple:
    return _validate(python, w, f"exp_manager.name={w}/abs")


def _hf(python: str, w: str) -> str:
    out = py(python, SETUP_HF, OUT=f"{w}/hf")
    assert out.returncode == 0, out.stderr
    return f"{w}/hf"


def _from_hf(python: str, hf: str, w: str) -> tuple[subprocess.CompletedProcess, float]:
    return nxd_cli(python, "ckpt", "convert", "--from", "hf", "--to", "full", "--model", "llama", "--input", hf,
                   "--output", f"{w}/full.pt")


def case_hf_index_escape(python: str, w: str) -> tuple:
    hf = _hf(python, w)
    shard = sorted(n for n in os.listdir(hf) if n.endswith(".safetensors"))[0]
    shutil.move(f"{hf}/{shard}", f"{w}/outside.safetensors")
    index = open(f"{hf}/model.safetensors.index.json").read().replace(shard, "../outside.safetensors")
    open(f"{hf}/model.safetensors.index.json", "w").write(index)
    out, s = _from_hf(python, hf, w)
    return out, s, f"read outside: {out.returncode == 0}"


def case_hf_truncated(python: str, w: str) -> tuple:
    hf = _hf(python, w)
    shard = sorted(n for n in os.listdir(hf) if n.endswith(".safetensors"))[1]
    data = open(f"{hf}/{shard}", "rb").read()
    open(f"{hf}/{shard}", "wb").write(data[:40])
    out, s = _from_hf(python, hf, w)
    return out, s, ""


def case_hf_export_flipped(python: str, w: str) -> tuple:
    hf = _hf(python, w)
    out, _ = _from_hf(python, hf, w)
    assert out.returncode == 0, out.stderr
    out, _ = nxd_cli(python, "ckpt", "convert", "--from", "full", "--to", "hf", "--model", "llama", "--input",
                     f"{w}/full.pt", "--config", f"{hf}/config.json", "--output", f"{w}/export")
    assert out.returncode == 0, out.stderr
    path = f"{w}/export/model.safetensors"
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 1
    open(path, "wb").write(bytes(data))
    out, s = _from_hf(python, f"{w}/export", w)
    return out, s, f"loaded: {out.returncode == 0}"


def _tmpfs(path: str, size: str = "1m") -> bool:
    os.makedirs(path, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True).returncode == 0


def case_hf_export_enospc(python: str, w: str) -> tuple:
    hf = _hf(python, w)
    out, _ = _from_hf(python, hf, w)
    if not _tmpfs(f"{w}/full_disk", "120k"):
        return None
    try:
        out, s = nxd_cli(python, "ckpt", "convert", "--from", "full", "--to", "hf", "--model", "llama", "--input",
                         f"{w}/full.pt", "--config", f"{hf}/config.json", "--output", f"{w}/full_disk/export")
    finally:
        subprocess.run(["umount", f"{w}/full_disk"])
    return out, s, ""


def _dcp(python: str, w: str, damage: str, foreign: bool = False) -> tuple:
    save = ("import torch.distributed.checkpoint as dcp; dist.destroy_process_group(); "
            "dcp.save(model.state_dict(), checkpoint_id=PATH, no_dist=True)") if foreign else "save_dcp(PATH, model)"
    out = py(python, DCP_SAVE + save, PATH=f"{w}/dcp")
    assert out.returncode == 0, out.stderr
    exec(damage, {"P": f"{w}/dcp", "os": os})
    t0 = time.perf_counter()
    out = py(python, DCP_SAVE + "load_dcp(PATH, model)\nprint('loaded without error')", PATH=f"{w}/dcp")
    return out, time.perf_counter() - t0, f"loaded: {'loaded without error' in out.stdout}"


FLIP = ("f = os.path.join(P, '__0_0.distcp'); d = bytearray(open(f, 'rb').read()); d[len(d) // 2] ^= 1; "
        "open(f, 'wb').write(bytes(d))")


def case_dcp_flipped(python: str, w: str) -> tuple:
    return _dcp(python, w, FLIP)


def case_dcp_garbage_metadata_foreign(python: str, w: str) -> tuple:
    return _dcp(python, w, "open(os.path.join(P, '.metadata'), 'wb').write(b'\\x80\\x04garbage')", foreign=True)


def case_dcp_truncated_foreign(python: str, w: str) -> tuple:
    return _dcp(python, w, "f = os.path.join(P, '__0_0.distcp'); open(f, 'r+b').truncate(1000)", foreign=True)


def case_dcp_enospc(python: str, w: str) -> tuple:
    if not _tmpfs(f"{w}/full_disk", "200k"):
        return None
    try:
        t0 = time.perf_counter()
        out = py(python, DCP_SAVE + "save_dcp(PATH, model)", PATH=f"{w}/full_disk/dcp")
        s = time.perf_counter() - t0
    finally:
        subprocess.run(["umount", f"{w}/full_disk"])
    return out, s, ""


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--work", default=None)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    root = tempfile.mkdtemp(dir=args.work)
    print("| case | exit | s | effect | last line |\n|---|---|---|---|---|")
    for name, fn in CASES.items():
        if args.only and name not in args.only:
            continue
        work = os.path.join(root, name)
        os.makedirs(work)
        try:
            result = fn(args.python, work)
        except AssertionError as exc:
            print(f"| {name} | setup failed | | | {str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''} |")
            continue
        if result is None:
            print(f"| {name} | skipped (no tmpfs) | | | |")
            continue
        out, seconds, effect = result
        print(f"| {name} | {out.returncode} | {seconds:.1f} | {effect} | `{last_line(out).replace('|', '/')}` |",
              flush=True)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
