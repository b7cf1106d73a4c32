"""Every config in configs/ loads, and its groups build a valid model and data setup; a config
file that does not load, and values that cannot work, are one error naming the file or the key."""

import dataclasses
import importlib.util
import io
import os
import pathlib
import re
import subprocess
import sys
import warnings

import jax
import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags
from run_configs import ROOT, tiny_run
from transformer_jax.config_checks import ConfigError, check_config
from transformer_jax import command_line
from transformer_jax.model_config import ModelConfig, get_model_config
from transformer_jax.command_line import (ConfigFileError, load_config_file,
                                          use_load_config_file)
from transformer_jax.run_config import build_model_config, data_fields, model_fields, optim_fields

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


CONFIG_FILE_ERRORS = [  # (the file's code, what the error says after "PATH")
    ("def get_config():\n    return d_modle\n",
     ", line 2: NameError: name 'd_modle' is not defined"),
    ("import os\nimport nosuchmod\n",
     ", line 2: ModuleNotFoundError: No module named 'nosuchmod'"),
    ("def get_config():\n    return (3).keys()\n",
     ", line 2: AttributeError: 'int' object has no attribute 'keys'"),
    ("X = 1\n",
     ": no get_config(); a config file defines get_config() returning an "
     "ml_collections.ConfigDict"),
    ("def get_config():\n    return 3\n",
     ": get_config() returned int, not an ml_collections.ConfigDict"),
    ("from ml_collections import ConfigDict\n\n\ndef get_config():\n"
     "    return ConfigDict({'num_train_steps': 3})\n",
     ": config.accumulation_steps, config.checkpoint_every_steps, config.checkpoints_to_keep "
     "and 12 more are missing; config files should start from run_config.base_config, which "
     "has every key, as configs/default.py does"),
    ("from transformer_jax.run_config import base_config, data_fields, model_fields, "
     "optim_fields\n\n\ndef get_config():\n    optim = optim_fields()\n    del optim['eps']\n"
     "    return base_config(model=model_fields('tiny'), data=data_fields(), optim=optim)\n",
     ": config.optim.eps is missing; config files should start from run_config.base_config, "
     "which has every key, as configs/default.py does"),
    ("from transformer_jax.run_config import base_config, data_fields, model_fields\n\n\n"
     "def get_config():\n    config = base_config(model=model_fields('tiny'), data=data_fields())\n"
     "    config.data.vocab_sise = 8000\n    return config\n",
     ": config.data.vocab_sise is not a setting (did you mean config.data.vocab_size?); the run "
     "would ignore it"),
    ("get_config = {'seed': 1}\n",
     ": no get_config(); a config file defines get_config() returning an "
     "ml_collections.ConfigDict"),
    ("def get_config():\n    return open('/nonexistent/sizes.txt')\n",
     ", line 2: FileNotFoundError: [Errno 2] No such file or directory: "
     "'/nonexistent/sizes.txt'"),
    ("def get_config():\n    return sizes()\n\n\ndef sizes():\n    return d_modle\n",
     ", line 6: NameError: name 'd_modle' is not defined"),
    ("def get_config():\n    return {}['d_model']\n", ", line 2: KeyError: 'd_model'"),
    ("from transformer_jax.run_config import base_config, data_fields, model_fields, "
     "optim_fields\n\n\ndef get_config():\n    optim = optim_fields()\n"
     "    for key in ('b1', 'b2', 'eps', 'warmup_steps'):\n        del optim[key]\n"
     "    return base_config(model=model_fields('tiny'), data=data_fields(), optim=optim)\n",
     ": config.optim.b1, config.optim.b2, config.optim.eps and 1 more are missing; config "
     "files should start from run_config.base_config, which has every key, as "
     "configs/default.py does"),
    ("from transformer_jax.run_config import base_config, data_fields, model_fields, "
     "optim_fields\n\n\ndef get_config():\n    optim = optim_fields()\n"
     "    del optim['b1'], optim['eps']\n"
     "    return base_config(model=model_fields('tiny'), data=data_fields(), optim=optim)\n",
     ": config.optim.b1, config.optim.eps are missing; config files should start from "
     "run_config.base_config, which has every key, as configs/default.py does"),
]


@pytest.mark.parametrize("code, problem", CONFIG_FILE_ERRORS,
                         ids=["NameError", "import", "quotes", "no get_config", "an int",
                              "keys missing", "a group's key missing", "a key misspelt",
                              "no function", "a file it reads", "in a helper", "a KeyError",
                              "four missing", "two missing"])
def test_a_config_file_that_does_not_load_is_one_line_naming_it(tmp_path, code, problem):
    path = tmp_path / "x.py"
    path.write_text(code)
    with pytest.raises(ConfigFileError) as caught:
        load_config_file(str(path))
    assert str(caught.value) == f"{path}{problem}"


def test_config_file_errors_without_a_line_of_code(tmp_path):
    """A syntax error names its own line; a file that cannot be read, the OS's reason, and
    for a misspelt name the closest config file of its folder."""
    (tmp_path / "broken.py").write_text("x = 1\ndef get_config(:\n")
    with pytest.raises(ConfigFileError, match=r"broken.py: SyntaxError: .*\(broken.py, line 2\)$"):
        load_config_file(str(tmp_path / "broken.py"))
    with pytest.raises(ConfigFileError) as caught:
        load_config_file(str(tmp_path / "missing.py"))
    assert str(caught.value) == f"{tmp_path / 'missing.py'}: No such file or directory"
    with pytest.raises(ConfigFileError) as caught:
        load_config_file(str(tmp_path / "brokne.py"))
    assert str(caught.value) == (f"{tmp_path / 'brokne.py'}: No such file or directory; did "
                                 f"you mean {tmp_path / 'broken.py'}?")
    with pytest.raises(ConfigFileError, match=r"^--config is empty \(an unset shell variable"):
        load_config_file("")


def test_config_file_arguments_are_all_that_follows_the_first_colon(tmp_path):
    """`PATH:ARGS` calls get_config(ARGS), as ml_collections reads it: one argument, colons
    and all. An empty PATH before the colon (`--config=$CONFIG:big`, CONFIG unset) is the
    empty --config's error."""
    path = tmp_path / "corpus.py"
    path.write_text("from transformer_jax.run_config import base_config, data_fields, "
                    "model_fields\n\n\ndef get_config(dataset):\n    return base_config("
                    "model=model_fields('tiny'), data=data_fields(dataset=dataset))\n")
    assert load_config_file(f"{path}:folder:corpora/de-en").data.dataset == "folder:corpora/de-en"
    with pytest.raises(ConfigFileError, match=r"^--config is empty \(an unset shell variable"):
        load_config_file(":big")


def test_a_config_file_may_define_a_dataclass(tmp_path):
    """The file runs as a module registered under its name, as an import would: a dataclass
    with postponed annotations looks its module up in sys.modules, and failed there with
    "'NoneType' object has no attribute '__dict__'"."""
    path = tmp_path / "sized.py"
    path.write_text("from __future__ import annotations\n\nimport dataclasses\n\n"
                    "from transformer_jax.run_config import base_config, data_fields, "
                    "model_fields\n\n\n@dataclasses.dataclass\nclass Sizes:\n"
                    "    d_model: int = 64\n\n\ndef get_config():\n    return base_config("
                    "model=model_fields('tiny', d_model=Sizes().d_model), data=data_fields())\n")
    assert load_config_file(str(path)).model.d_model == 64


def test_a_missing_config_file_is_matched_with_the_py_files_of_a_folder_that_exists(tmp_path):
    """In a folder that is not there either, the OS's reason alone (listing it was a
    FileNotFoundError of its own); an editor's backup beside a config file is not offered."""
    nowhere = tmp_path / "nowhere" / "default.py"
    with pytest.raises(ConfigFileError) as caught:
        load_config_file(str(nowhere))
    assert str(caught.value) == f"{nowhere}: No such file or directory"
    (tmp_path / "default.py").write_text("")
    (tmp_path / "defualt.py~").write_text("")
    with pytest.raises(ConfigFileError) as caught:
        load_config_file(str(tmp_path / "defualt.py"))
    assert str(caught.value) == (f"{tmp_path / 'defualt.py'}: No such file or directory; did "
                                 f"you mean {tmp_path / 'default.py'}?")


def _parse_config_flag(*args: str):
    """A --config flag as train.py defines it, with `use_load_config_file` (as parse_flags
    calls it), parsed from `args`; returns the config."""
    argv = ["train.py", *args]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=flag_values, sys_argv=argv)
    use_load_config_file(flag_values)
    flag_values(argv)
    return flag_values.config


def test_a_config_flag_loads_its_file_with_load_config_file(tmp_path):
    """The config locked, with its override applied; an error in the file one
    ConfigFileError, not absl's usage message of several lines."""
    config = _parse_config_flag(f"--config={CONFIGS[0]}", "--config.seed=7")
    assert config.seed == 7 and config.is_locked
    assert set(config.optim) == set(optim_fields())
    bad = tmp_path / "bad.py"
    bad.write_text(CONFIG_FILE_ERRORS[0][0])
    with pytest.raises(ConfigFileError, match=f"^{re.escape(str(bad))}, line 2: NameError"):
        _parse_config_flag(f"--config={bad}", "--config.seed=7")


def _parse_command_line(monkeypatch, *args: str, default_config: str | None = None):
    """`parse_flags` as train.py calls it, on absl's FLAGS of a --config flag alone (absl's
    FLAGS and Python's way of showing warnings put back after the test); returns the
    config."""
    argv = ["train.py", *args]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=flag_values, sys_argv=argv)
    monkeypatch.setattr(flags, "FLAGS", flag_values)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    command_line.parse_flags(argv, default_config=default_config)
    return flag_values.config


def test_overrides_apply_to_the_default_config_when_none_is_named(monkeypatch):
    """train.py without --config runs its default config, with the overrides given (absl
    reads the flags in order: an override before the config flag it belongs to is an
    unknown flag); a --config named is loaded in its place."""
    config = _parse_command_line(monkeypatch, "--config.seed=7", default_config=str(CONFIGS[0]))
    assert (config.seed, config.model.d_model) == (7, 128)  # configs/default.py's model
    big = _parse_command_line(monkeypatch, f"--config={CONFIGS[-1]}", "--config.seed=7",
                              default_config=str(CONFIGS[0]))
    assert (big.seed, big.model.d_model) == (7, 1024)  # §6.2's big model


def test_parse_flags_writes_the_packages_warnings_in_one_line(monkeypatch, capsys):
    _parse_command_line(monkeypatch, f"--config={CONFIGS[0]}")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn_explicit("tokenizer.model is stale", UserWarning,
                               filename=command_line.__file__, lineno=7)
    assert capsys.readouterr().err == "warning: tokenizer.model is stale\n"


def test_parse_flags_ends_a_bad_command_line_in_one_error(tmp_path, monkeypatch):
    """A config file that does not load: "error: " and its line. A value with a line break
    (absl's message then has several lines) is still named with its key's type. An override
    in absl's --no form of a key that does not exist still names the key."""
    missing = tmp_path / "missing.py"
    for args, message in (
            ([f"--config={missing}"], f"error: {missing}: No such file or directory"),
            ([f"--config={CONFIGS[0]}", "--config.seed=1\n2"],
             "error in the command line: --config.seed=1\n2: config.seed is an integer, got "
             "'1\\n2'")):
        with pytest.raises(SystemExit) as caught:
            _parse_command_line(monkeypatch, *args)
        assert caught.value.code == message
    with pytest.raises(SystemExit) as caught:
        _parse_command_line(monkeypatch, f"--config={CONFIGS[0]}", "--noconfig.model.preset")
    assert caught.value.code.startswith("error in the command line: ")
    assert "preset" in caught.value.code and "\n" not in caught.value.code


@pytest.mark.filterwarnings("ignore:the load_module")  # ml_collections' loader
def test_a_config_file_ml_collections_could_not_load_is_one_line_at_first_use(tmp_path):
    """A config flag whose default file ml_collections' own parser could not load holds a
    stand-in that raises an OSError of several lines at its first use: its last line, the
    OS's reason naming the file, ends the command. A config that loaded is given back."""
    missing = tmp_path / "missing.py"
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", str(missing), flag_values=flag_values,
                                    sys_argv=["train.py"])
    flag_values(["train.py"])
    with pytest.raises(SystemExit) as caught:
        command_line.loaded_config(flag_values.config)
    assert caught.value.code == (f"error: cannot load --config: [Errno 2] No such file or "
                                 f"directory: '{missing}'")
    config = load_config_file(str(CONFIGS[0]))
    assert command_line.loaded_config(config) is config


def test_an_override_of_a_key_that_is_nowhere_close_lists_its_groups_keys():
    """ml_collections names the key alone where no key is close to it; the command line then
    names the override and the keys of its group. For a close key, ml_collections' "'d_modle'
    Did you mean ..." names neither the override nor the group: it is said as the others."""
    expected = {
        "--config.model.preset=tiny": "--config.model.preset: config.model has no key "
                                      "'preset'; its keys: " + ", ".join(sorted(model_fields(
                                          "base"))),
        "--config.optim.x.y=2": "--config.optim.x.y: config.optim has no key 'x'; its keys: "
                                "b1, b2, eps, grad_clip_norm, label_smoothing, "
                                "learning_rate_scale, warmup_steps",
        "--config.model.d_modle=3": "--config.model.d_modle: config.model has no key "
                                    "'d_modle'; did you mean 'd_model'?",
        # The override whose group lacks the key, not the first that names it.
        "--config.seed=1 --config.decode.seed=2": "--config.decode.seed: config.decode has no "
                                                  "key 'seed'; its keys: " + ", ".join(sorted(
                                                      load_config_file(str(CONFIGS[0])).decode))}
    for overrides, message in expected.items():
        argv = ["train.py", f"--config={CONFIGS[0]}", *overrides.split()]
        with pytest.raises((AttributeError, KeyError)) as caught:
            _parse_config_flag(*argv[1:])
        assert command_line._bad_override(caught.value, argv) == (
            f"error in the command line: {message}")


@pytest.mark.parametrize("key, value, message", [
    ("optim.label_smoothing", 1.5,
     "config.optim.label_smoothing must be a number in [0, 1), got 1.5"),
    ("optim.b1", -0.1, "config.optim.b1 must be a number in [0, 1), got -0.1"),
    ("optim.b2", 1.0, "config.optim.b2 must be a number in [0, 1), got 1.0"),
    ("optim.eps", 0.0, "config.optim.eps must be a number > 0, got 0.0"),
    ("optim.learning_rate_scale", -1.0,
     "config.optim.learning_rate_scale must be a finite number > 0, got -1.0"),
    ("optim.grad_clip_norm", -1.0,
     "config.optim.grad_clip_norm must be >= 0 (0: no clipping), got -1.0"),
    ("optim.warmup_steps", 0, "config.optim.warmup_steps must be a positive integer, got 0"),
    ("model.dtype", "x", "config.model.dtype must be one of 'float32', 'bfloat16', 'float16', "
                         "got 'x'"),
    ("data.vocab_size", 260, "config.data.vocab_size must be an integer >= 261 (the "
                             "tokenizer's 4 special and 256 byte pieces, and one per distinct "
                             "character of the corpus), got 260"),
    ("data.tokenizer_sentences", 0,
     "config.data.tokenizer_sentences must be a positive integer, got 0"),
    *[("data.dataset", name, f"config.data.dataset: unknown dataset {name!r}; use "
       "\"numbers\", \"tfds:NAME\" (e.g. tfds:wmt14_translate/de-en) or \"folder:PATH\"")
      for name in ("wmt14", "tfds:", "folder:", "numbers:small", "Numbers")],
])
def test_optim_and_model_errors_name_the_full_key(key, value, message):
    config = tiny_run(**{key: value})
    with pytest.raises(ConfigError) as caught:
        check_config(config)
    assert str(caught.value) == message


def test_xla_attention_in_float16_is_refused_where_it_cannot_compile():
    """model.attention_implementation="xla" with model.dtype="float16": on a CPU, whose XLA
    cannot compile it, one line naming the key before anything compiles; elsewhere it runs."""
    config = tiny_run(**{"model.dtype": "float16", "model.attention_implementation": "xla"})
    if jax.default_backend() != "cpu":
        check_config(config)
        return
    with pytest.raises(ConfigError) as caught:
        check_config(config)
    assert str(caught.value).startswith(
        "config.model.attention_implementation='xla' cannot run float16 on a CPU (")
    assert str(caught.value).endswith("; use 'auto', which falls back where it cannot run")
    check_config(tiny_run(**{"model.dtype": "float16"}))  # "auto": the reference attention


def test_the_edges_of_the_optim_ranges_are_allowed():
    check_config(tiny_run(**{"optim.b1": 0.0, "optim.b2": 0.0, "optim.label_smoothing": 0.0,
                             "optim.grad_clip_norm": 0.0, "optim.eps": 1e-30}))


def test_keys_with_hyphens_or_without_a_value_are_refused_and_a_true_or_false_one_is_true():
    """A value after a space is absl's syntax, and a true-or-false key alone is true; a key
    of another type with no value, last or before another flag, is refused (absl had taken
    the next flag as its value), and so is a key with a character no key has."""
    refuse = command_line._refuse_malformed_keys
    refuse(["train.py", "--config.model.pre_layer_norm", "--config.seed=1"])
    refuse(["train.py", "--config.seed", "7", "--config.optim.b1", "-0.5"])  # absl's to check
    for argv, message in (
            (["--config.seed", "--config.num_train_steps=9"], "--config.seed needs a value"),
            (["--config.optim.eps"], "--config.optim.eps needs a value"),
            (["--config.num-train-steps=5"], "did you mean --config.num_train_steps?"),
            (["--config.optim.beta-1=0.8"], "underscores and dots$"),  # no such key: no hint
            (["--config.model..d_model=3"], "underscores and dots$"),  # was a SyntaxError's repr
            (["--config.seed.=3"], "underscores and dots$"),
            (["--config.seed!=3"], "underscores and dots$")):
        with pytest.raises(SystemExit, match=message):
            refuse(["train.py", *argv])


def test_command_lines_write_the_packages_warnings_in_one_line(capsys):
    """After `one_line_warnings` (train.py, translate.py and the other command lines), a
    warning raised in the package is "warning: MESSAGE" alone; another library's goes to the
    handler before (Python's, with its file and line); a second call changes nothing."""
    before = []
    with warnings.catch_warnings():  # restores warnings.showwarning
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, filename, lineno, *_: before.append(
            (str(message), category, filename, lineno))
        command_line.one_line_warnings()
        ours = warnings.showwarning
        command_line.one_line_warnings()
        assert warnings.showwarning is ours
        warnings.warn_explicit("tokenizer.model is stale", UserWarning,
                               filename=command_line.__file__, lineno=7)
        warnings.warn_explicit("a library's notice", DeprecationWarning,
                               filename="/elsewhere/library.py", lineno=3)
        # A library's warning raised through the package's code keeps its category too.
        warnings.warn_explicit("jax will change", FutureWarning,
                               filename=command_line.__file__, lineno=9)
    assert capsys.readouterr().err == "warning: tokenizer.model is stale\n"
    assert before == [("a library's notice", DeprecationWarning, "/elsewhere/library.py", 3),
                      ("jax will change", FutureWarning, command_line.__file__, 9)]


def test_a_warning_shown_into_a_file_or_from_a_sibling_folder_is_pythons(capsys):
    """A package warning shown into a file given (`warnings.showwarning(..., file=f)`, the
    caller's own log) goes there as Python writes it, its line of code too; one from a
    folder whose name starts with the package's (transformer_jax_extras/) is no package
    warning."""
    shown = []

    def python_s(message, category, filename, lineno, file=None, line=None):
        shown.append((message, category, filename, lineno, file, line))

    log = io.StringIO()
    sibling = command_line.__file__.replace(f"transformer_jax{os.sep}",
                                            f"transformer_jax_extras{os.sep}")
    with warnings.catch_warnings():  # restores warnings.showwarning
        warnings.simplefilter("always")
        warnings.showwarning = python_s
        command_line.one_line_warnings()
        warnings.showwarning("tokenizer.model is stale", UserWarning, command_line.__file__, 7,
                             file=log, line="config = load()")
        warnings.warn_explicit("an extra's notice", UserWarning, filename=sibling, lineno=3)
    assert capsys.readouterr().err == ""
    assert shown[0] == ("tokenizer.model is stale", UserWarning, command_line.__file__, 7, log,
                        "config = load()")
    assert [entry[1:4] for entry in shown[1:]] == [(UserWarning, sibling, 3)]


# Runs a command line as `python FILE ARGS` or `python -m MODULE ARGS` would, then prints
# which of the heavy libraries it imported: JSON of the names, after its own output.
WHAT_IT_IMPORTED = """
import json, runpy, sys
target, sys.argv = sys.argv[1], sys.argv[1:]
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
except SystemExit as end:
    print(end.code if isinstance(end.code, str) else "", file=sys.stderr)
heavy = ("jax", "flax", "optax", "orbax", "grain")
print(json.dumps([name for name in heavy if name in sys.modules]))
"""


RUN = ["--config=configs/default.py", "--workdir={workdir}"]


@pytest.mark.parametrize("command, error", [
    (["train.py", *RUN, "--config.decode.beam_size=0"],
     "error: config.decode.beam_size must be a positive integer, got 0"),
    (["train.py", *RUN, "--config.model.num_heads=5"],
     "error: config.model.d_model must be divisible by num_heads=5, got 128"),
    (["train.py", *RUN, "--config.model.attention_implementation=flash"],
     "error: config.model.attention_implementation must be one of 'reference', 'xla', "
     "'cudnn', 'auto', got 'flash'"),
    (["train.py", *RUN, "--config.num_train_stepz=5"],
     "error in the command line: --config.num_train_stepz: config has no key "
     "'num_train_stepz'; did you mean 'num_train_steps'?"),
    # absl's error for a flag it does not know, once an override had defined its own flag,
    # was "The flag 'config.seed' is defined twice" (absl parsed the command line again).
    (["train.py", *RUN, "--config.seed=1", "--bogus=1"],
     "FATAL Flags parsing error: Unknown command line flag 'bogus'"),
    (["train.py", *RUN, "--config.seed=1", "--num_train_steps=100"],
     "error in the command line: --num_train_steps: the config's keys are set as "
     "--config.KEY=VALUE; did you mean --config.num_train_steps=100?"),
    (["train.py", *RUN, "--config.model.d-model=256"],
     "error in the command line: --config.model.d-model: a config key is written with "
     "letters, digits, underscores and dots; did you mean --config.model.d_model?"),
    (["train.py", *RUN, "--config.num_train_steps"],
     "error in the command line: --config.num_train_steps needs a value: "
     "--config.num_train_steps=VALUE"),
    (["transformer_jax.data", "preapre"],
     "error: unknown command 'preapre': use prepare, or show (the same as no command)"),
    (["transformer_jax.data", *RUN, "--config.data.tokenizer_type=wordpiece"],
     "error: config.data.tokenizer_type must be one of 'bpe', 'unigram', got 'wordpiece'"),
    (["translate.py", "--workdir={workdir}", "--output="],
     "error: --output is empty (an unset shell variable?); name a file, or leave the flag "
     "out for stdout"),
    (["translate.py", "--workdir={workdir}", "--input="],
     "error: --input is empty (an unset shell variable?); name a file, or leave the flag "
     "out for stdin"),
    (["translate.py", "--workdir={workdir}", "--beam_size=0"],
     "FATAL Flags parsing error: flag --beam_size=0: 0 is not a positive integer"),
    (["evaluate.py", "--workdir={workdir}", "--split=dev"],
     "FATAL Flags parsing error: flag --split=dev: value should be one of "
     "<train|validation|test>"),
    (["transformer_jax.export", "--workdir={workdir}", "--format=onnx", "--output={workdir}"],
     "FATAL Flags parsing error: flag --format=onnx: value should be one of "
     "<ctranslate2|stablehlo>"),
], ids=lambda value: value[-1] if isinstance(value, list) else None)
def test_a_bad_command_line_is_answered_before_jax_loads(tmp_path, command, error):
    """The command lines check their flags, and train.py and the data command the config's
    values too, with the modules of the config (no JAX, Flax, optax, orbax or grain): the
    answer takes a fraction of a second, not the seconds those take to import. (TFDS, half
    a second, is not among them: the built-in dataset's sizes are checked with it.)"""
    workdir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", WHAT_IT_IMPORTED,
                           *(part.format(workdir=workdir) for part in command)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert error in done.stderr.splitlines(), done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
    assert not workdir.exists()


def test_the_devices_checks_are_left_to_the_run_that_joined_its_processes():
    """`devices=False` (train.py before its processes join) passes what only this machine's
    backend refuses; the full check refuses it."""
    config = tiny_run(**{"model.attention_implementation": "cudnn"})
    check_config(config, devices=False)
    with pytest.raises(ConfigError, match="'cudnn' needs an NVIDIA GPU"):
        check_config(config)


def test_the_edges_of_the_batch_and_length_rules():
    """A token budget of exactly the longest row holds one row; one token less holds none.
    A learned position table exactly as long as the longest row fits it; rows of either
    side longer than the table are refused, naming the longest. Buckets: at least one."""
    check_config(tiny_run(per_device_batch_size=0, **{"data.tokens_per_batch": 24}))
    with pytest.raises(ConfigError, match=r"^config\.data\.tokens_per_batch=23 holds not one "
                                          r"row of 24 tokens"):
        check_config(tiny_run(per_device_batch_size=0, **{"data.tokens_per_batch": 23}))
    learned = {"model.positional_encoding": "learned", "model.max_length": 24}
    check_config(tiny_run(**learned))
    for side in ("source", "target"):
        with pytest.raises(ConfigError, match=r"^config\.model\.max_length=24 \(the learned "
                                              r"position table\) is shorter than the rows "
                                              r"\(30 tokens\)"):
            check_config(tiny_run(**learned, **{f"data.max_{side}_length": 30}))
    with pytest.raises(ConfigError) as caught:
        check_config(tiny_run(**{"data.num_buckets": 0}))
    assert str(caught.value) == "config.data.num_buckets must be a positive integer, got 0"


def test_a_value_of_another_type_is_named_with_the_type_its_key_takes():
    """absl's "could not convert string to float" (on two lines) is said as the key's type,
    from base_config: a number, an integer, true or false."""
    bad = command_line._bad_value
    assert bad("--config.optim.eps", "tiny") == (
        "error in the command line: --config.optim.eps=tiny: config.optim.eps is a number, "
        "got 'tiny'")
    assert bad("--config.seed", "1e3").endswith(": config.seed is an integer, got '1e3'")
    assert bad("--config.model.pre_layer_norm", "maybe").endswith(
        ": config.model.pre_layer_norm is true or false, got 'maybe'")


def test_flag_errors_of_a_command_without_a_config_are_absls_own(monkeypatch):
    """translate.py has no --config: its unknown --seed is absl's error, not a pointer to a
    --config.seed it does not have. A message of several lines is indented under the
    heading, as absl's app.parse_flags_with_usage writes it."""
    monkeypatch.setattr(flags, "FLAGS", flags.FlagValues())  # no config flag
    argv = ["translate.py", "--seed=3"]
    assert command_line._flag_error(flags.UnrecognizedFlagError("seed", "--seed=3"), argv) == (
        "FATAL Flags parsing error: Unknown command line flag 'seed'\n"
        "Pass --helpshort or --helpfull to see help on flags.")
    assert command_line._flag_error(flags.Error("flag --input: first\nsecond"), argv) == (
        "FATAL Flags parsing error:\n  flag --input: first\n  second\n"
        "Pass --helpshort or --helpfull to see help on flags.")


def test_the_search_flags_left_unset_are_none_for_the_runs_settings():
    """--beam_size, --alpha and --max_extra_length default to None, which Translator reads
    as the run's config.decode: a default of their own would replace the settings of a run
    trained with others. A value is read with Translator's rule."""
    holders = command_line.define_search_flags()
    try:
        assert [(holder.name, holder.default) for holder in holders] == [
            ("beam_size", None), ("alpha", None), ("max_extra_length", None)]
        flags.FLAGS["beam_size"].parse("3")
        assert flags.FLAGS["beam_size"].value == 3
    finally:
        for holder in holders:
            delattr(flags.FLAGS, holder.name)


@pytest.mark.parametrize("key", ["num_train_steps", "accumulation_steps", "log_every_steps",
                                 "eval_every_steps", "checkpoint_every_steps",
                                 "checkpoints_to_keep", "decode.bleu_examples"])
def test_every_count_of_the_run_is_refused_at_0_and_named(key):
    """A 0 interval would turn its work off without a word (`every > 0` in the loop), and 0
    checkpoints kept is no resume: each is refused, naming its key; 1 is accepted."""
    check_config(tiny_run(**{key: 1, "per_device_batch_size": 1}))
    with pytest.raises(ConfigError) as caught:
        check_config(tiny_run(**{key: 0}))
    assert str(caught.value) == f"config.{key} must be a positive integer, got 0"


@pytest.mark.parametrize("key, rule", [
    ("profile_steps", "an integer >= 0 (0: off)"),
    ("decode.bleu_every_steps", "an integer >= 0 (0: off)"),
    ("loss_chunk_size", "an integer >= 0 (0: the whole logits)"),
    ("data.tokens_per_batch", "an integer >= 0 (0: config.per_device_batch_size rows per "
                              "device)")])
def test_a_negative_switch_is_refused_not_taken_for_off(key, rule):
    """-1 is no "off" (only 0 is): refused, naming the key and its rule."""
    with pytest.raises(ConfigError) as caught:
        check_config(tiny_run(**{key: -1}))
    assert str(caught.value) == f"config.{key} must be {rule}, got -1"


@pytest.mark.parametrize("key, value, message", [
    ("num_train_steps", True, "config.num_train_steps must be a positive integer, got True"),
    ("seed", False, "config.seed must be an integer >= 0, got False"),
    ("optim.eps", True, "config.optim.eps must be a number > 0, got True"),
    ("optim.b1", False, "config.optim.b1 must be a number in [0, 1), got False"),
    ("decode.beam_size", True, "config.decode.beam_size must be a positive integer, got True"),
    ("decode.alpha", True, "config.decode.alpha must be a non-negative number, got True"),
])
def test_true_or_false_is_no_count_and_no_number(key, value, message):
    """Python's bool is an int (True == 1), but `num_train_steps: True` is a mistake: in a
    dict of the config's keys (as `train` takes one; a ConfigDict's float key turns True into
    1.0), refused, naming the key."""
    config = tiny_run().to_dict()
    *groups, name = key.split(".")
    (config[groups[0]] if groups else config)[name] = value
    with pytest.raises(ConfigError) as caught:
        check_config(ml_collections.ConfigDict(config))
    assert str(caught.value) == message


def test_rows_per_device_and_a_token_budget_together_are_refused():
    """Exactly one of the two sizes the batch: both set is one error naming both."""
    with pytest.raises(ConfigError) as caught:
        check_config(tiny_run(per_device_batch_size=2, **{"data.tokens_per_batch": 100}))
    assert str(caught.value) == (
        "config.per_device_batch_size=2 and config.data.tokens_per_batch=100 both size the "
        "batch: set per_device_batch_size=0 to batch by tokens, or tokens_per_batch=0")


def test_the_checked_copy_leaves_the_callers_config_as_it_was(tmp_path, monkeypatch):
    """A relative folder corpus is made absolute in the run's copy only: the caller's
    ConfigDict (whose groups a shallow copy would share) keeps its relative path."""
    from transformer_jax.config_checks import checked_copy

    monkeypatch.chdir(tmp_path)
    config = tiny_run(**{"data.dataset": "folder:corpus", "data.vocab_size": 300})
    copy = checked_copy(config)
    assert copy.data.dataset == f"folder:{tmp_path / 'corpus'}"
    assert config.data.dataset == "folder:corpus"


def test_the_search_and_smoothing_defaults_are_the_papers():
    """§6.1: beam size 4, length penalty α 0.6; §5.4: label smoothing ε_ls 0.1."""
    config = tiny_run()
    assert (config.decode.beam_size, config.decode.alpha) == (4, 0.6)
    assert optim_fields().label_smoothing == 0.1


def test_build_model_config_takes_the_tokenizers_size():
    """The model's vocabulary is the tokenizer's size given, whatever it is."""
    assert build_model_config(model_fields("tiny"), vocab_size=131).vocab_size == 131
