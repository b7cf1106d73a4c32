"""The training state and its shapes: one definition, concrete and abstract alike."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer_jax.model import Transformer, count_parameters
from transformer_jax.model_config import get_model_config
from transformer_jax.optim import make_optimizer
from transformer_jax.train_state import (
    TrainState,
    abstract_params,
    abstract_train_state,
    create_train_state,
    init_params,
)

MODEL = Transformer(get_model_config("tiny", vocab_size=40))


def shapes(tree):
    return jax.tree.map(lambda x: (np.shape(x), jnp.result_type(x)), tree)


def test_the_abstract_state_has_the_concrete_states_tree_shapes_and_dtypes():
    """With gradient clipping too: the abstract state follows whatever `tx` holds."""
    for tx in (make_optimizer(d_model=32).tx, make_optimizer(d_model=32, grad_clip_norm=1.0).tx):
        state = create_train_state(MODEL, tx, jax.random.key(0))
        abstract = abstract_train_state(MODEL, tx)
        assert isinstance(state, TrainState) and isinstance(abstract, TrainState)
        assert int(state.step) == 0 and state.tx is tx and abstract.tx is tx
        assert shapes(abstract) == shapes(state)
        assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(abstract))
        assert shapes(abstract_params(MODEL)) == shapes(state.params)


def test_the_parameters_come_from_the_key_alone():
    state = create_train_state(MODEL, optax.sgd(0.1), jax.random.key(7))
    again = init_params(MODEL, jax.random.key(7))
    other = init_params(MODEL, jax.random.key(8))
    # create_train_state runs init under jit: rounding may differ in the last bit.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 state.params, again)
    assert not all(np.array_equal(a, b)
                   for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(other)))
    assert count_parameters(MODEL.config)["total"] == sum(
        x.size for x in jax.tree.leaves(abstract_params(MODEL)))
