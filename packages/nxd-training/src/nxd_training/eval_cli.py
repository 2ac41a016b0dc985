"""The ``nxd eval`` and ``nxd generate`` verbs (registered through ``nxd_register_commands``)."""

from __future__ import annotations

import argparse
import sys

from nxd import Command, ComponentNotFound, ConfigError, NxdError
from nxd.cli import take_trailing_flags

PATH_HELP = ("a run directory of nxd train (its newest complete checkpoint), its checkpoints/ directory, or one "
             "checkpoint (<run>/checkpoints/<tag>); any TP/PP/DP/EP layout loads into one process")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help=PATH_HELP)
    parser.add_argument("--tag", help="checkpoint tag (default: the newest complete one)")
    parser.add_argument("--config", help="the run's config.yaml (default: the one in the run directory)")


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("overrides", nargs=argparse.REMAINDER,
                        help="dotted.key=value overrides of the run's config, e.g. trainer.limit_val_batches=1.0 "
                             "(the whole validation set) or data.val_dir=other/")
    parser.add_argument("--samples", type=int, default=0, metavar="N",
                        help="also print N generated samples (the run's generation.prompts, then openings of "
                             "validation sequences)")


def _generate_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--prompt", action="append", required=True, help="text to continue (repeat for several)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the run's generation.max_new_tokens")
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: the run's seed)")


def _target(verb: str, args: argparse.Namespace):  # noqa: ANN202 - EvalTarget
    from nxd_training.evaluate import describe, locate

    target = locate(args.path, args.tag, args.config)
    print(f"nxd {verb}: weights from checkpoint {describe(target)}; model "
          f"{target.record.get('name') or 'from the run config'!r}; one process", flush=True)
    return target


def _run_eval(args: argparse.Namespace) -> int:
    from nxd_training.evaluate import loaded, sample_prompts
    from nxd_training.samples import generate_samples

    try:
        take_trailing_flags(args, (), {"--samples": int, "--tag": str, "--config": str})
        if args.samples < 0:
            raise ConfigError("--samples must be 0 or more")
        target = _target("eval", args)
        with loaded(target, args.overrides) as trainer:
            loss = trainer.validate()
            if loss is None:
                raise ConfigError("no validation batches (trainer.limit_val_batches, or the data module's validation "
                                  "split is empty); e.g. add trainer.limit_val_batches=1.0")
            terms = "".join(f", {k} {v:.6f}" for k, v in sorted(trainer.valid_metrics.items()))
            print(f"nxd eval: validation loss {loss:.6f}{terms}", flush=True)
            if args.samples:
                gen = trainer.config.generation
                base = gen.model_dump() if gen is not None else {}
                from nxd_training.config.schema import GenerationConfig

                config = GenerationConfig(**{**base, "prompts": sample_prompts(trainer, args.samples)})
                generate_samples(config, trainer.config.data, trainer.config.seed, trainer.model, trainer.spec)
    except (ConfigError, ComponentNotFound, NxdError, OSError) as exc:
        print(f"nxd eval: {exc}", file=sys.stderr)
        return 2
    return 0


def _run_generate(args: argparse.Namespace) -> int:
    from nxd_training.config.schema import GenerationConfig
    from nxd_training.evaluate import loaded
    from nxd_training.samples import generate_samples

    try:
        target = _target("generate", args)
        with loaded(target) as trainer:
            if trainer.spec.generate is None:
                raise ConfigError(f"model {trainer.spec.name!r} provides no generate (ModelSpec.generate)")
            gen = trainer.config.generation
            base = gen.model_dump() if gen is not None else {}
            chosen = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k}
            config = GenerationConfig(**{**base, "prompts": args.prompt, "do_sample": args.do_sample,
                                         **{k: v for k, v in chosen.items() if v is not None}})
            seed = trainer.config.seed if args.seed is None else args.seed
            if not generate_samples(config, trainer.config.data, seed, trainer.model, trainer.spec):
                raise ConfigError("no tokenizer recorded in the run config (data.tokenizer): nothing to decode with")
    except (ConfigError, ComponentNotFound, NxdError, OSError) as exc:
        print(f"nxd generate: {exc}", file=sys.stderr)
        return 2
    return 0


EVAL = Command(help="validation loss (and --samples) of a checkpoint, at any layout it was written with",
               add_arguments=_eval_arguments, run=_run_eval)
GENERATE = Command(help="continue --prompt texts with a checkpoint's model (LoRA and MoE runs included)",
                   add_arguments=_generate_arguments, run=_run_generate)
