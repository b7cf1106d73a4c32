"""`python -m transformer_jax --preset=tiny`: build a model, count it, run it once.

A quick check that the install works and a look at a preset's size.
"""

import argparse
import functools
import sys
import time

import jax
import jax.numpy as jnp

from transformer_jax.model import Transformer, count_parameters
from transformer_jax.model_config import PRESETS, get_model_config
from transformer_jax.train_state import init_params


def positive_int(text: str) -> int:
    """argparse's type for a count: "0", "-3" or "x" is a usage error naming the value."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m transformer_jax", description=__doc__)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--vocab_size", type=int, default=None, help="override the preset's V")
    parser.add_argument("--batch", type=positive_int, default=2,
                        help="B of the demo forward pass")
    parser.add_argument("--length", type=positive_int, default=16,
                        help="S = T of the demo forward pass")
    args = parser.parse_args(argv)
    overrides = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    try:
        config = get_model_config(args.preset, **overrides)
    except ValueError as error:
        parser.error(str(error))

    print(f"preset {args.preset!r}: {config}")
    counts = count_parameters(config)
    for part, n in counts.items():
        print(f"  {part:>8}: {n:>13,} parameters")

    tokens_BS = jax.random.randint(jax.random.key(0), (args.batch, args.length), 1,
                                   config.vocab_size)
    model = Transformer(config)
    variables = {"params": jax.jit(functools.partial(init_params, model))(jax.random.key(1))}
    forward = jax.jit(model.apply)
    try:
        jax.block_until_ready(forward(variables, tokens_BS, tokens_BS))  # compile
        start = time.perf_counter()
        logits_BTV = jax.block_until_ready(forward(variables, tokens_BS, tokens_BS))
    except jax.errors.JaxRuntimeError as error:  # the (B, N, S, S) scores grow as S²
        if not str(error).startswith("RESOURCE_EXHAUSTED"):
            raise
        sys.exit(f"error: the forward pass of {args.batch} x {args.length} tokens does not "
                 f"fit in memory ({str(error).splitlines()[0]}); choose a smaller --batch "
                 f"or --length")
    elapsed_ms = 1e3 * (time.perf_counter() - start)
    print(f"forward pass on {jax.devices()[0].platform}: inputs {tokens_BS.shape} -> "
          f"logits {logits_BTV.shape} {logits_BTV.dtype} in {elapsed_ms:.1f} ms "
          f"(mean logit {float(jnp.mean(logits_BTV)):+.4f})")


if __name__ == "__main__":
    main()
