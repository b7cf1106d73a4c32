"""What a checkpoint must agree with before a run resumes from it, checked before anything
compiles: its vocabulary's settings (before the data is prepared), then its model, its
tokenizer, and the optimizer state's tree.

    refuse_other_vocabulary(metadata, config.data, where="W/checkpoints/40")
    refuse_other_run(metadata, model_config, config.optim, tokenizer, workdir=W,
                     where="W/checkpoints/40")  # each a ConfigError, or None

Settings that keep the state (learning_rate_scale, num_train_steps, intervals...) resume,
and so do the model settings that change how a step computes but not the parameters
(`COMPUTE_FIELDS`: dtype, dropout, the attention and layer norm implementations), with a
line naming them: a float32 run can go on in bfloat16 on a GPU, or with another dropout.
"""

import dataclasses

import jax
import jax.numpy as jnp

from transformer_jax.config_checks import ConfigError
from transformer_jax.data.vocabulary import other_tokenizer, vocabulary_settings
from transformer_jax.optim import optimizer_from_config

# ModelConfig fields that leave the parameters' tree, shapes and meaning as they are.
COMPUTE_FIELDS = ("dtype", "dropout_rate", "attention_dropout_rate", "dropout_bits",
                  "attention_implementation", "layer_norm_implementation")


def refuse_other_run(metadata: dict, model_config, optim, tokenizer, *, workdir: str,
                     where: str) -> None:
    """A ConfigError when `workdir`'s checkpoint at `where` (its `metadata`) was written by
    another model, with another tokenizer, or with optim settings that build another
    optimizer state; nothing is moved or changed. The `COMPUTE_FIELDS` may differ
    (`refuse_other_model` returns them)."""
    refuse_other_model(metadata["model"], model_config, workdir)
    if why := other_tokenizer(metadata, tokenizer):
        raise ConfigError(f"{where} {why}, or train in a new --workdir")
    refuse_other_optimizer(metadata.get("config", {}).get("optim") or {}, optim,
                           model_config.d_model, where)


def refuse_other_vocabulary(metadata: dict, data_config, where: str) -> None:
    """A ConfigError naming each setting of the vocabulary (`vocabulary_settings`) but the
    dataset that `where`'s checkpoint (its `metadata`) was trained with another value of:
    checked before the data is prepared, so that a workdir whose tokenizer was deleted is
    refused at once rather than after a tokenizer is trained that `refuse_other_run` then
    refuses. (The dataset is left to the tokenizer's SHA-256: a folder moved or copied is the
    same data under another name.)"""
    saved = metadata.get("config", {}).get("data") or {}
    now = vocabulary_settings(data_config)
    _refuse_changes(f"{where} was trained with", changed_settings(
        "data", saved, now, [k for k in now if k != "dataset"]), "the vocabulary")


def _refuse_changes(written: str, changed: list[str], what: str) -> None:
    """A ConfigError "{written} A and B, which change {what}; resume with the saved values,
    or train in a new --workdir" for the `changed` settings (`changed_settings`), if any."""
    if changed:
        one = len(changed) == 1
        raise ConfigError(f"{written} {' and '.join(changed)}, which change{'s' if one else ''} "
                          f"{what}; resume with the saved value{'' if one else 's'}, or train "
                          f"in a new --workdir")


def refuse_other_model(saved: dict, model_config, workdir: str) -> list[str]:
    """A ConfigError naming each field of `model_config` but `COMPUTE_FIELDS` that the
    checkpoint's model (`saved`) has another value of; those of `COMPUTE_FIELDS` are
    returned, each as "model.FIELD: saved A, now B". A field it does not name (one added
    since it was written, such as dropout_bits) counts as the field's default."""
    wanted = dataclasses.asdict(model_config)
    defaults = {f.name: f.default for f in dataclasses.fields(model_config)}
    was = {k: saved.get(k, defaults[k]) for k in wanted}
    diffs = {k: (f"{k}: saved {saved[k]!r}, now {wanted[k]!r}" if k in saved else
                 f"{k}: not saved (so {was[k]!r}, its default), now {wanted[k]!r}")
             for k in sorted(wanted) if was[k] != wanted[k]}
    other = [diff for k, diff in diffs.items() if k not in COMPUTE_FIELDS]
    if other:
        raise ConfigError(f"{workdir} holds a run of another model ({', '.join(other)}); use "
                          f"a new --workdir or the config it was trained with")
    return [f"model.{diff}" for k, diff in diffs.items() if k in COMPUTE_FIELDS]


def changed_settings(group: str, saved: dict, now: dict, keys) -> list[str]:
    """"group.key=saved, now new" for each of `keys` saved with another value."""
    return [f"{group}.{k}={saved[k]!r}, now {now[k]!r}" for k in keys
            if k in saved and saved[k] != now[k]]


def changed_layout(saved: dict, now: dict, *, dropout: bool) -> list[str]:
    """How the updates' rows changed from a checkpoint's layout (`saved`; {} where it was not
    recorded) to the run's (`now`), each as `changed_settings` says a setting's: the rows
    per update (not per_device_batch_size or tokens_per_batch, which may change them or
    not), and, with `dropout`, who draws the masks: `pmap` folds each device's index into
    its key, so its draws change with the device count and differ from `sharded`'s, which
    draws the global batch's on any count."""
    if not saved:
        return []
    changes = changed_settings("layout", saved, now, ["rows_per_update"])
    same_draws = saved.get("parallelism") == now["parallelism"] and (
        now["parallelism"] == "sharded" or saved.get("devices") == now["devices"])
    if dropout and not same_draws:
        changes.append(f"dropout drawn by {saved.get('parallelism')} on {saved.get('devices')} "
                       f"devices, now {now['parallelism']} on {now['devices']}")
    return changes


def _optimizer_state_tree(optim: dict, d_model: int):
    """The tree structure of the optimizer state that `optim`'s settings build (over a
    one-array parameter tree: a setting changes it for every tree or for none)."""
    tx = optimizer_from_config(optim, d_model).tx
    params = {"w": jax.ShapeDtypeStruct((1,), jnp.float32)}
    return jax.tree.structure(jax.eval_shape(tx.init, params))


def refuse_other_optimizer(saved: dict, optim, d_model: int, where: str) -> None:
    """A ConfigError naming each optim setting whose change alone, from `saved` (the
    checkpoint's optim settings), changes the optimizer state's tree. Saved settings that
    build no optimizer (another version's) are left to the restore's own check of the tree."""
    now = optim.to_dict()
    try:
        before = _optimizer_state_tree(saved, d_model)
        keys = [k for k in now if k in saved and saved[k] != now[k]
                and _optimizer_state_tree({**saved, k: now[k]}, d_model) != before]
    except (KeyError, TypeError, ValueError):
        return
    _refuse_changes(f"{where} was written with", changed_settings("optim", saved, now, keys),
                    "the optimizer state")
