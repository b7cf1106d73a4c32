"""The training state, and its shapes, from one definition.

    state = create_train_state(model, tx, jax.random.key(seed))  # training starts here
    abstract_train_state(model, tx)  # its shapes: a full restore (a resume) reads into them
    abstract_params(model)           # the parameters' shapes: inference restores only these

The abstract versions are `jax.eval_shape` of the concrete ones: nothing is
allocated, and they cannot drift apart. `init_params` runs the model's own
`init` on one dummy token: no parameter's shape depends on the batch or the
length (positions are sinusoidal, §3.5, or a table of `max_length` rows).
"""

import functools

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state


class TrainState(train_state.TrainState):
    """Step, parameters and optimizer state (flax's TrainState)."""


def init_params(model, rng) -> dict:
    """Fresh parameters of `model` (a `Transformer`), drawn from `rng`."""
    tokens_11 = jnp.ones((1, 1), jnp.int32)
    return model.init(rng, tokens_11, tokens_11)["params"]


@functools.partial(jax.jit, static_argnums=0)
def _compiled_init_params(model, rng) -> dict:
    """`init_params` under jit, compiled once per model: an equal model (a run started
    again in the same process) reuses the compilation."""
    return init_params(model, rng)


def create_train_state(model, tx: optax.GradientTransformation, rng) -> TrainState:
    """Step 0, fresh parameters from `rng` and `tx`'s initial state for them."""
    params = _compiled_init_params(model, rng)
    return TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def abstract_params(model) -> dict:
    """The shapes and dtypes of `init_params`, as `jax.ShapeDtypeStruct`s."""
    return jax.eval_shape(functools.partial(init_params, model), jax.random.key(0))


def abstract_train_state(model, tx: optax.GradientTransformation) -> TrainState:
    """The shapes and dtypes of `create_train_state`, as `jax.ShapeDtypeStruct`s."""
    return jax.eval_shape(functools.partial(create_train_state, model, tx), jax.random.key(0))
