"""The ``nxd ckpt`` command: ``inspect``, ``list``, ``verify`` and ``convert`` sub-verbs."""

from __future__ import annotations

import argparse
import json
import os
import sys

from nxd.components import Command
from nxd.errors import NxdError
from nxd_ckpt.errors import CheckpointError
from nxd_ckpt.run_dir import checkpoint_root


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="ckpt_verb", metavar="VERB", required=True)
    insp = verbs.add_parser("inspect", help="print a checkpoint's metadata (degrees, tensors, versions)")
    insp.add_argument("path", help="checkpoint directory (local path or URL such as s3://bucket/run), or a run "
                                    "directory of nxd train (its checkpoints/)")
    insp.add_argument("--tag", help="checkpoint tag (default: the newest complete one)")
    insp.add_argument("--json", action="store_true", help="print the raw metadata JSON")
    lst = verbs.add_parser("list", help="list the tags under a checkpoint directory and whether they are complete")
    lst.add_argument("path", help="checkpoint directory, or a run directory of nxd train (its checkpoints/)")
    ver = verbs.add_parser("verify", help="check every file of a checkpoint against the checksums recorded at save")
    ver.add_argument("path", help="checkpoint directory (local path or URL), or a run directory of nxd train")
    ver.add_argument("--tag", required=True, help="checkpoint tag")
    ver.add_argument("--mark-done", action="store_true",
                     help="after a clean verification, mark a whole checkpoint that lacks its 'done' marker complete "
                          "(auto-resume then uses it)")
    conv = verbs.add_parser("convert", help="convert model weights between hf, nxd, dcp, full-state and plugins' "
                                                          "checkpoint kinds (torchtitan, nnm)")
    conv.add_argument("--from", dest="source", required=True, help="source kind (hf, nxd, full, dcp, or a plugin's: torchtitan, nnm)")
    conv.add_argument("--to", dest="target", required=True, help="target kind (hf, nxd, full, dcp, or a plugin's: torchtitan)")
    conv.add_argument("run", nargs="?", metavar="RUN_DIR",
                      help="a run directory of nxd train (same as --input; its checkpoints record the model and "
                           "tokenizer, so --from nxd --to hf needs nothing else)")
    conv.add_argument("--input", help="source directory or file")
    conv.add_argument("--output", help="target directory or file (--from nxd --to hf of a run directory: "
                                       "default <run dir>/hf/<tag>)")
    conv.add_argument("--model", help="registered model name (needed for hf)")
    conv.add_argument("--tag", help="nxd checkpoint tag to read or write")
    conv.add_argument("--config", help="model config.json (Hugging Face keys), or what the source kind reads "
                                       "(nnm: an NNM YAML whose model section is used)")
    conv.add_argument("--lora", choices=("merge", "adapter"),
                      help="a LoRA run to hf: merge the adapters into the weights, or write the base model plus the "
                           "adapters in PEFT's format (<output>/lora_adapter/)")
    conv.add_argument("--allow-pickle", action="store_true",
                      help="let sources that read pickled files (nnm) unpickle: only for files you trust")


def _inspect(args: argparse.Namespace) -> int:
    from nxd_ckpt.consolidate import resolve_tag
    from nxd_ckpt.layout import read_done
    from nxd_ckpt.metadata import read_metadata
    from nxd_ckpt.storage import open_storage

    args.path = checkpoint_root(args.path)
    storage = open_storage(args.path)
    tag = resolve_tag(args.path, args.tag)
    meta = read_metadata(storage, tag, read_done(storage, tag).get("metadata"))
    if meta is None:
        print(f"{storage.describe(tag)}: no metadata.json (written by NxD itself); files:")
        for sub in ("model", "optim"):
            for name in storage.list_files(f"{tag}/{sub}"):
                print(f"  {sub}/{name}")
        return 0
    if args.json:
        print(json.dumps(meta, indent=1))
        return 0
    d = meta["degrees"]
    print(f"checkpoint {storage.describe(tag)}")
    print(f"  degrees: tp={d['tp']} pp={d['pp']} dp={d['dp']} world={d['world']}  model format: {meta['model_format']}"
          f"  zero1: {meta.get('zero1')}")
    print("  versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    print(f"  tensors ({len(meta['tensors'])}):")
    for name, e in meta["tensors"].items():
        sh = e["sharding"]
        how = "replicated" if sh is None else f"dim {sh['dim']}" + (f" stride {sh['stride']}" if sh["stride"] > 1 else "") + (
            f" fused {sh['fused_splits']}" if sh.get("fused_splits") else "") + (
            f" kv x{sh['kv_size_multiplier']}" if sh.get("kv_size_multiplier", 1) > 1 else "")
        print(f"    {name:50s} {str(e['shape']):16s} {e['dtype']:9s} pp{e['pp_rank']} {how}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from nxd_ckpt.layout import list_tags
    from nxd_ckpt.storage import open_storage

    args.path = checkpoint_root(args.path)
    storage = open_storage(args.path)
    if "://" not in args.path and not os.path.isdir(args.path):
        what = "is a file" if os.path.exists(args.path) else "does not exist"
        raise CheckpointError(f"{args.path} {what}; give the checkpoint directory (the one holding the tags)")
    infos = list_tags(storage)
    if not infos:
        raise CheckpointError(f"{storage.describe('')}: no checkpoints (no tag directories with a 'checkpoint' "
                              "marker or model/ inside)")
    for info in infos:
        print(f"{info.tag}\t{'complete' if info.complete else 'INCOMPLETE'}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from nxd_ckpt.verify import verify_checkpoint

    args.path = checkpoint_root(args.path)
    n = verify_checkpoint(args.path, args.tag, mark_done=args.mark_done)
    print(f"{args.tag}: {n} files match their checksums" + (" (marked complete)" if args.mark_done else ""))
    return 0


def _convert(args: argparse.Namespace) -> int:
    from nxd_ckpt.convert import run_convert

    if (args.run is None) == (args.input is None):
        raise CheckpointError("give the source once: a run directory (nxd ckpt convert --from nxd --to hf RUN_DIR) "
                              "or --input")
    run_convert(args.source, args.target, args.input or args.run, args.output, model=args.model, tag=args.tag,
                config_path=args.config, allow_pickle=args.allow_pickle, lora=args.lora)
    return 0


def _run(args: argparse.Namespace) -> int:
    try:
        return {"inspect": _inspect, "list": _list, "verify": _verify, "convert": _convert}[args.ckpt_verb](args)
    except (CheckpointError, NxdError, OSError) as exc:
        print(f"nxd ckpt {args.ckpt_verb}: error: {exc}", file=sys.stderr)
        return 1


CKPT_COMMAND = Command(help="inspect, list, verify and convert checkpoints", add_arguments=_add_arguments, run=_run)
