"""``nxd data`` verbs: ``prepare``, ``train-tokenizer``, ``quickstart``."""

from __future__ import annotations

import argparse
import json
import sys

from nxd.components import Command
from nxd.errors import NxdError


def _add_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", "-i", nargs="+", required=True, help="text/JSONL/parquet files or a saved HF dataset dir")
    p.add_argument("--format", default="auto", choices=["auto", "text", "jsonl", "parquet", "hf"])
    p.add_argument("--text-key", default="text", help="JSONL field / parquet column holding the text")
    p.add_argument("--text-mode", default="file", choices=["file", "line", "paragraph"],
                   help="plain text: one document per file, per line, or per blank-line paragraph")
    p.add_argument("--hf-split", default="train", help="split of a saved HF DatasetDict")
    p.add_argument("--encoding", default="utf-8", help="text encoding of text/JSONL inputs (default utf-8)")
    p.add_argument("--encoding-errors", default="strict", choices=["strict", "replace", "ignore"],
                   help="what to do with bytes the encoding cannot decode (default: stop with an error)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="data_verb", metavar="VERB")
    prep = verbs.add_parser("prepare", help="tokenize documents into a Megatron indexed dataset (.bin/.idx)")
    _add_source_args(prep)
    prep.add_argument("--tokenizer", "-t", required=True, help="tokenizer.json, tokenizer.model, or their directory")
    prep.add_argument("--output-prefix", "-o", required=True, help="writes PREFIX.bin, PREFIX.idx, PREFIX.json")
    prep.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    prep.add_argument("--dtype", default="auto", choices=["auto", "uint16", "int32"])
    prep.add_argument("--no-eos", action="store_true", help="do not append EOS to every document")
    prep.add_argument("--add-bos", action="store_true", help="prepend BOS to every document")
    prep.add_argument("--quiet", action="store_true", help="no progress bar")
    train = verbs.add_parser("train-tokenizer", help="train a byte-level BPE tokenizer offline")
    _add_source_args(train)
    train.add_argument("--vocab-size", type=int, default=4096)
    train.add_argument("--output", "-o", required=True, help="directory for tokenizer.json + tokenizer_config.json")
    quick = verbs.add_parser("quickstart", help="build the embedded-corpus tokenizer and dataset (cached)")
    quick.add_argument("--output", "-o", required=True)
    quick.add_argument("--vocab-size", type=int, default=4096)


def run(args: argparse.Namespace) -> int:
    try:
        if args.data_verb == "prepare":
            from nxd_data.prepare import prepare_dataset

            meta = prepare_dataset(
                args.input, args.tokenizer, args.output_prefix, fmt=args.format, text_key=args.text_key,
                text_mode=args.text_mode, hf_split=args.hf_split, workers=args.workers, dtype=args.dtype,
                append_eos=not args.no_eos, add_bos=args.add_bos, progress=not args.quiet,
                encoding=args.encoding, encoding_errors=args.encoding_errors,
            )
            print(json.dumps(meta, indent=2))
        elif args.data_verb == "train-tokenizer":
            from nxd_data.sources import iter_documents
            from nxd_data.train_tokenizer import short_vocabulary_note, train_bpe_tokenizer

            docs = iter_documents(args.input, args.format, args.text_key, args.text_mode, args.hf_split,
                                  args.encoding, args.encoding_errors)
            out = train_bpe_tokenizer(docs, args.vocab_size, args.output)
            print(f"wrote {out}/tokenizer.json" + short_vocabulary_note(out, args.vocab_size))
        elif args.data_verb == "quickstart":
            from nxd_data.quickstart import prepare_quickstart_data

            print(json.dumps(prepare_quickstart_data(args.output, args.vocab_size), indent=2))
        else:
            print("usage: nxd data {prepare,train-tokenizer,quickstart} ...", file=sys.stderr)
            return 2
    except NxdError as exc:
        print(f"nxd data {args.data_verb}: error: {exc}", file=sys.stderr)
        return 1
    return 0


DATA_COMMAND = Command(help="prepare datasets and tokenizers (nxd-data)", add_arguments=add_arguments, run=run)
