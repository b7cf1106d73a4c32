"""The paper's optimizer (§5.3): Adam with warmup then inverse-square-root decay.

The optimizer state does not carry the learning rate. `make_optimizer` returns
the transformation with the one schedule object it follows, which the train step
logs: the update that moves the step count from c to c + 1 uses

    make_optimizer(...).learning_rate_fn(c) == learning_rate(c + 1, ...)
"""

import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from transformer_jax.argument_checks import finite_number, positive_int, value_kind


def learning_rate(step, *, d_model: int, warmup_steps: int = 4000, scale: float = 1.0):
    """lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)  (§5.3, eq. 3).

    `step` is the 1-based number of the update. The rate rises linearly for
    `warmup_steps` steps, peaks at step = warmup_steps with d_model^-0.5 ·
    warmup_steps^-0.5 (about 7.0e-4 for base: d_model 512, warmup 4000), then
    decays as step^-0.5. `scale` is not in the paper (it is 1 there).

    An integer (Python's or NumPy's) gives a Python float (step must be >= 1); an array
    or a float gives float32 (a step of 0 or less gives 0: no update yet).
    """
    _check_schedule_args(d_model, warmup_steps, scale)
    if value_kind(step) not in "iuf":  # jnp.asarray took True as step 1, "10" as step 10
        raise ValueError(f"step must be a number or an array of them, got {step!r}")
    if isinstance(step, numbers.Integral):
        if step < 1:
            raise ValueError(f"step is 1-based, got {step}")
        step = int(step)
        return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
    step = jnp.maximum(jnp.asarray(step, jnp.float32), 0.0)  # rsqrt of a negative: NaN
    return _rate(step, d_model, warmup_steps, scale)


def _rate(step, d_model: int, warmup_steps: int, scale: float) -> jax.Array:
    """Eq. 3 of a float32 `step` >= 0 (0 gives 0: min(inf, 0))."""
    decay = jnp.minimum(jax.lax.rsqrt(step), step * jnp.float32(warmup_steps**-1.5))
    return jnp.float32(scale * d_model**-0.5) * decay


def learning_rate_schedule(
    *, d_model: int, warmup_steps: int = 4000, scale: float = 1.0
) -> optax.Schedule:
    """`learning_rate` as an optax schedule of the update count.

    optax passes count 0 for the first update; the schedule maps count c to
    step c + 1, so the first update uses step 1 (step 0 would give a rate of 0).
    """
    _check_schedule_args(d_model, warmup_steps, scale)

    def schedule(count):  # count >= 0: no clamp in the compiled step
        return _rate(jnp.asarray(count, jnp.float32) + 1.0, d_model, warmup_steps, scale)

    return schedule


class Optimizer(NamedTuple):
    """The paper's Adam (`tx`, an optax transformation) and the schedule it follows."""

    tx: optax.GradientTransformation
    learning_rate_fn: optax.Schedule


def make_optimizer(
    *,
    d_model: int,
    warmup_steps: int = 4000,
    learning_rate_scale: float = 1.0,
    b1: float = 0.9,
    b2: float = 0.98,
    eps: float = 1e-9,
    grad_clip_norm: float = 0.0,
) -> Optimizer:
    """Adam (β1 = 0.9, β2 = 0.98, ε = 1e-9) with `learning_rate_schedule` (§5.3), and that
    schedule, built once: what the optimizer uses is what the trainer logs.

    grad_clip_norm > 0 clips the gradient to that global norm before Adam; the
    paper does not clip (0, the default, means no clipping).
    """
    if grad_clip_norm < 0:
        raise ValueError(f"grad_clip_norm must be >= 0 (0: no clipping), got {grad_clip_norm}")
    schedule = learning_rate_schedule(
        d_model=d_model, warmup_steps=warmup_steps, scale=learning_rate_scale
    )
    adam = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    if grad_clip_norm > 0:
        adam = optax.chain(optax.clip_by_global_norm(grad_clip_norm), adam)
    return Optimizer(adam, schedule)


def _check_schedule_args(d_model, warmup_steps, scale) -> None:
    positive_int("d_model", d_model)
    positive_int("warmup_steps", warmup_steps)
    finite_number("scale (learning_rate_scale)", scale, strict=True)


def optimizer_from_config(optim_group, d_model: int) -> Optimizer:
    """`make_optimizer` from a run config's optim group (a ConfigDict or a plain dict).

    The trainer builds its optimizer here, and so does anything that restores a
    saved optimizer state, so the two always have the same structure.
    """
    o = dict(optim_group)
    return make_optimizer(d_model=d_model, warmup_steps=o["warmup_steps"],
                          learning_rate_scale=o["learning_rate_scale"], b1=o["b1"], b2=o["b2"],
                          eps=o["eps"], grad_clip_norm=o["grad_clip_norm"])
