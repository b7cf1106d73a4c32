"""`python -m transformer_jax --preset=tiny`: build a model, count it, run it once.

A quick check that the install works and a look at a preset's size.
"""

import argparse
import functools
import sys
import time

import jax
import jax.numpy as jnp

from transformer_jax.argument_checks import positive_int
from transformer_jax.model import Transformer, count_parameters
from transformer_jax.model_config import PRESETS, get_model_config
from transformer_jax.train_state import init_params

MAX_TOKENS = 2**31 - 1  # B × S of the demo batch: its ids are int32


def count(flag: str):
    """argparse's type for a count flag, with `argument_checks.positive_int`'s rule and words:
    "0", "-3" or "x" is a usage error naming the value."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = text
        try:
            return positive_int(flag, value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix(f"{flag} ")) from None
    return parse


def main(argv=None) -> None:
    """Prints the preset's config and parameter counts, then times one forward pass."""
    parser = argparse.ArgumentParser(prog="python -m transformer_jax", description=__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                        help="the model's size (base and big: Table 3)")
    parser.add_argument("--vocab_size", type=int, default=None, help="override the preset's V")
    parser.add_argument("--batch", type=count("--batch"), default=2,
                        help="B of the demo forward pass")
    parser.add_argument("--length", type=count("--length"), default=16,
                        help="S = T of the demo forward pass")
    args = parser.parse_args(argv)
    if args.batch * args.length > MAX_TOKENS:
        parser.error(f"--batch × --length is {args.batch * args.length:,} tokens; at most "
                     f"{MAX_TOKENS:,} (int32 ids)")
    overrides = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    try:
        config = get_model_config(args.preset, **overrides)
    except ValueError as error:
        parser.error(str(error))

    print(f"preset {args.preset!r}: {config}")
    counts = count_parameters(config)
    width = len(f"{max(counts.values()):,}")
    for part, n in counts.items():
        print(f"  {part:>8}: {n:>{width},} parameters")
    try:
        logits_BTV, elapsed_ms, shape = forward_once(config, args.batch, args.length)
    except jax.errors.JaxRuntimeError as error:  # the (B, N, S, S) scores grow as S²
        first = str(error).splitlines()[0]
        if not any(mark in first for mark in ("RESOURCE_EXHAUSTED", "Out of memory")):
            raise
        sys.exit(f"error: the model and the forward pass of {args.batch} x {args.length} "
                 f"tokens do not fit in memory ({first}); choose a smaller --batch, "
                 f"--length or --vocab_size")
    print(f"forward pass on {jax.devices()[0].platform}: inputs {shape} -> "
          f"logits {logits_BTV.shape} {logits_BTV.dtype} in {elapsed_ms:.1f} ms "
          f"(mean logit {float(jnp.mean(logits_BTV)):+.4f})")


def forward_once(config, batch: int, length: int):
    """(logits, milliseconds, input shape) of the second forward pass of a new model on
    random ids (the first compiles)."""
    tokens_BS = jax.random.randint(jax.random.key(0), (batch, length), 1, config.vocab_size)
    model = Transformer(config)
    variables = {"params": jax.jit(functools.partial(init_params, model))(jax.random.key(1))}
    forward = jax.jit(model.apply)
    jax.block_until_ready(forward(variables, tokens_BS, tokens_BS))  # compile
    start = time.perf_counter()
    logits_BTV = jax.block_until_ready(forward(variables, tokens_BS, tokens_BS))
    return logits_BTV, 1e3 * (time.perf_counter() - start), tokens_BS.shape


if __name__ == "__main__":
    main()
