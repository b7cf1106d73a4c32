"""Every config in configs/ loads, and its groups build a valid model and data setup."""

import dataclasses
import importlib.util
import pathlib

import pytest
from transformer_jax.config_checks import check_config
from transformer_jax.model_config import ModelConfig, get_model_config
from transformer_jax.run_config import build_model_config, data_fields, model_fields

CONFIGS = sorted((pathlib.Path(__file__).resolve().parents[1] / "configs").glob("*.py"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_builds_a_model_and_has_every_data_key(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    model = build_model_config(config.model, vocab_size=config.data.vocab_size)
    assert isinstance(model, ModelConfig) and model.vocab_size == config.data.vocab_size
    assert set(config.data) == set(data_fields())
    check_config(config)  # the values too: the batch sized one way, the choices known
    assert path.read_text().startswith('"""')  # a docstring with the command


def test_model_fields_round_trip_a_preset():
    """model_fields drops only vocab_size; build_model_config puts the tokenizer's back."""
    group = model_fields("base", dropout_rate=0.2)
    assert set(group) == {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size"}
    assert build_model_config(group, 37_000) == get_model_config("base", dropout_rate=0.2)


def test_data_fields_overrides_and_rejects_typos():
    assert data_fields(vocab_size=8000).vocab_size == 8000
    assert data_fields(data_dir="/data").data_dir == "/data"  # a placeholder takes a str
    with pytest.raises(KeyError, match="vocab_sise"):
        data_fields(vocab_sise=8000)
