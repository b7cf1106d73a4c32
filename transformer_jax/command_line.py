"""The command line of train.py, translate.py, evaluate.py and the data command.

    app.run(main, flags_parser=parse_flags)   # --config files and --config.key=value overrides

A config file (`--config=configs/x.py`) is loaded by `load_config_file`: whatever is
wrong with it (an exception in its code, no get_config, keys missing) is one line naming
the file, and so is an override that does not apply. The search flags of translate.py
and evaluate.py are defined once, here. The package's warnings are one line each
(`one_line_warnings`, which `parse_flags` turns on).
"""

import ast
import difflib
import importlib.machinery
import importlib.util
import os
import re
import sys
import textwrap
import traceback
import warnings

import ml_collections
import tqdm
from absl import flags

from transformer_jax.run_config import SEARCH_SETTINGS, every_key, missing_and_unknown_keys


def define_search_flags():
    """translate.py's and evaluate.py's --beam_size, --alpha and --max_extra_length; left
    unset (None), they are the run's `config.decode` (`Translator.search_settings`)."""
    return (define_setting_flag("beam_size", None, "beam size; 1 is greedy search (default: "
                                "the run's config.decode, §6.1's 4)"),
            define_setting_flag("alpha", None, "length penalty exponent (default: the run's, "
                                "0.6)"),
            define_setting_flag("max_extra_length", None, "output tokens beyond the input "
                                "length: its batch's longest, rounded up to a multiple of "
                                "8 (default: the run's, 50)"))


def define_setting_flag(name: str, default, help: str) -> flags.FlagHolder:
    """The flag --`name`, parsed by `SEARCH_SETTINGS[name]`: a value Translator refuses is
    refused on the command line too, in the same words."""
    return flags.DEFINE(SEARCH_SETTINGS[name], name, default, help,
                        serializer=flags.ArgumentSerializer())


def parse_flags(argv: list[str], default_config: str | None = None) -> list[str]:
    """absl's flag parsing, with a one-line error for a config file that does not load or a
    bad `--config.key=value`.

    Pass as `app.run(main, flags_parser=parse_flags)`: config files are loaded by
    `load_config_file`; ml_collections raises a KeyError (with a "did you mean") or
    a type error from deep in the parser for an override.
    `default_config` is the `--config` of a command line that names none; a config
    flag defined with that default would apply the overrides while the flag is
    defined, at import, where no error can be caught.
    """
    one_line_warnings()
    named = any(a == "--config" or a.startswith("--config=") for a in argv[1:])
    if default_config and not named:
        argv = [argv[0], f"--config={default_config}", *argv[1:]]
    use_load_config_file(flags.FLAGS)
    _refuse_malformed_keys(argv)
    try:
        try:
            return flags.FLAGS(argv)
        except flags.Error as error:  # a --config.key's value of another type: one line
            if match := re.fullmatch(r"flag (--config\.[\w.]+)=(.*?): .*", str(error), re.S):
                raise SystemExit(_bad_value(*match.groups())) from None
            raise SystemExit(_flag_error(error, argv)) from None
    except ConfigFileError as error:
        raise SystemExit(f"error: {error}") from None
    except _OVERRIDE_ERRORS as error:
        raise SystemExit(_bad_override(error, argv)) from None
    except OSError as error:  # an override of a config file that ml_collections deferred
        raise SystemExit(_cannot_load(error)) from None


def one_line_warnings() -> None:
    """The package's own warnings (UserWarnings raised in its files) as "warning: MESSAGE"
    on stderr, above any progress bar, where Python writes "FILE:LINE: UserWarning: MESSAGE"
    and the line of code; any other warning as Python writes it. For command lines: a
    notebook or a program that imports the package keeps Python's way."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    show = warnings.showwarning
    if getattr(show, "one_line", False):
        return

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if (category is UserWarning and file is None
                and os.path.abspath(filename).startswith(package)):
            tqdm.tqdm.write(f"warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    showwarning.one_line = True
    warnings.showwarning = showwarning


class ConfigFileError(Exception):
    """A config file that does not load or lacks keys. Not a ValueError: absl's flag parsing
    would turn that into a usage message of several lines."""


def load_config_file(argument: str, module_name: str = "config_config"):
    """The locked ConfigDict that `get_config()` of the file `argument` names returns (`PATH`,
    or `PATH:ARGS` to call `get_config(ARGS)`, as ml_collections' config_flags reads it).

    A ConfigFileError names the file and what is wrong: an exception in its code (type,
    message and the file's line), no get_config, a result that is no ConfigDict, or keys of
    `base_config` that it lacks.
    """
    path, *args = argument.split(":", 1)
    if not path:
        raise ConfigFileError("--config is empty (an unset shell variable?); name a config "
                              "file such as configs/default.py")
    module = _run_file(path, module_name)
    if not callable(getattr(module, "get_config", None)):
        raise ConfigFileError(f"{path}: no get_config(); a config file defines get_config() "
                              f"returning an ml_collections.ConfigDict")
    try:
        config = module.get_config(*args)
    except Exception as error:  # the config file's own code
        raise ConfigFileError(_error_in_file(path, error)) from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigFileError(f"{path}: get_config() returned {type(config).__name__}, not an "
                              f"ml_collections.ConfigDict")
    _require_every_key(path, config)
    config.lock()  # a misspelt --config.key is an error, not a new field
    return config


def _run_file(path: str, module_name: str):
    loader = importlib.machinery.SourceFileLoader(module_name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(module_name, loader))
    sys.modules[module_name] = module  # as an import does: dataclasses and pickle look there
    try:
        loader.exec_module(module)
    except Exception as error:
        raise ConfigFileError(_error_in_file(path, error)) from None
    return module


def _near_config(path: str) -> str:
    """"; did you mean configs/default.py?" for a missing configs/defualt.py: the closest
    name among the .py files of its folder (there or not at all)."""
    folder = os.path.dirname(path) or os.curdir
    if os.path.exists(path) or not os.path.isdir(folder):
        return ""
    names = [name for name in os.listdir(folder) if name.endswith(".py")]
    close = difflib.get_close_matches(os.path.basename(path), names, n=1)
    return f"; did you mean {os.path.join(os.path.dirname(path), close[0])}?" if close else ""


def _error_in_file(path: str, error: Exception) -> str:
    """`PATH, line N: Type: message` at the file's innermost line in the traceback; a
    SyntaxError's message names its own file and line, and a file that cannot be read
    has no line."""
    if isinstance(error, OSError) and error.filename == path:
        return f"{path}: {error.strerror}{_near_config(path)}"
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
             if os.path.abspath(frame.filename) == os.path.abspath(path)]
    where = f", line {lines[-1]}" if lines else ""
    return f"{path}{where}: {type(error).__name__}: {_one_line(error)}"


def _require_every_key(path: str, config) -> None:
    """Every key of `base_config` and no other: a key the run does not read (a misspelt
    one, `config.num_train_step = 5`) would be ignored without a word."""
    missing, unknown = missing_and_unknown_keys(config)
    if missing:
        named = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if missing[3:] else "")
        raise ConfigFileError(f"{path}: {named} {'is' if len(missing) == 1 else 'are'} missing; "
                              f"config files should start from run_config.base_config, "
                              f"which has every key, as configs/default.py does")
    if unknown:
        raise ConfigFileError(f"{path}: {unknown}; the run would ignore it")


class _ConfigFileParser(flags.ArgumentParser):
    """The parser of a config-file flag: `load_config_file` in place of ml_collections' own
    loading, which defers some errors to the config's first use and lets others out as
    tracebacks."""

    def __init__(self, flag_name: str):
        self._module_name = f"{flag_name}_config"  # ml_collections' name for the module

    def parse(self, argument: str):
        return load_config_file(argument, self._module_name)

    def flag_type(self) -> str:
        return "config object"


def use_load_config_file(flag_values) -> None:
    """Has every config-file flag (`config_flags.DEFINE_config_file`) in `flag_values` load
    its file with `load_config_file`; call it before the flags are parsed."""
    from ml_collections.config_flags import config_flags  # the module, where the class is

    for name in flag_values:
        flag = flag_values[name]
        if isinstance(flag.parser, config_flags.ConfigFileFlagParser):
            flag.parser = _ConfigFileParser(flag.name)


_OVERRIDE_ERRORS = (AttributeError, KeyError, TypeError, ValueError)


def _flag_error(error: flags.Error, argv: list[str]) -> str:
    """absl's words for its own errors, as `app.parse_flags_with_usage` writes them (parsing
    again would define the overrides' flags twice: "The flag 'config.seed' is defined
    twice"); an unknown flag that is a config key's name is sent to its `--config.` form."""
    message = str(error)
    if match := re.fullmatch(r"Unknown command line flag '(\w+)'.*", message, re.S):
        if "config" in flags.FLAGS and (path := _config_key_path(match[1])):
            given = next((a for a in argv[1:] if re.match(rf"--(no)?{match[1]}\b", a)), "")
            value = given.partition("=")[2] if "=" in given else "VALUE"
            return (f"error in the command line: --{match[1]}: the config's keys are set as "
                    f"--config.KEY=VALUE; did you mean --config.{path}={value}?")
    shown = f"\n{textwrap.indent(message, '  ')}" if "\n" in message else f" {message}"
    return (f"FATAL Flags parsing error:{shown}\n"
            f"Pass --helpshort or --helpfull to see help on flags.")


def _base_value(path: str):
    """The value of `every_key()` at "model.d_model", or None."""
    value = every_key()
    for part in path.split("."):
        value = value.get(part) if isinstance(value, ml_collections.ConfigDict) else None
    return value


def _config_key_path(name: str) -> str | None:
    """"model.d_model" for "d_model": the path of the one setting of `every_key()` named
    `name` (at any depth; not a group), or None."""
    def paths(config, prefix=""):
        for key, value in config.items():
            if isinstance(value, ml_collections.ConfigDict):
                yield from paths(value, f"{prefix}{key}.")
            else:
                yield prefix + key

    found = [p for p in paths(every_key())
             if p.rsplit(".", 1)[-1] == name]
    return found[0] if len(found) == 1 else None


def _refuse_malformed_keys(argv: list[str]) -> None:
    """`--config.num-train-steps=5` (a hyphen: ml_collections reads the key as Python, and
    said "malformed node or string on line 1: <ast.BinOp object at 0x...>") and
    `--config.seed` with no value, last or before another flag (absl took that flag as its
    value; last, its error was "defined twice"). A true-or-false key alone is true, as absl
    reads it."""
    for i, arg in enumerate(argv[1:], start=1):
        name, has_value, _ = arg.partition("=")
        if not name.startswith("--config."):
            continue
        key = name.removeprefix("--config.")
        if not re.fullmatch(r"\w+(\.\w+)*", key):
            hint = key.replace("-", "_")
            maybe = (f"; did you mean --config.{hint}?" if re.fullmatch(r"\w+(\.\w+)*", hint)
                     and _base_value(hint) is not None else "")
            raise SystemExit(f"error in the command line: {name}: a config key is written "
                             f"with letters, digits, underscores and dots{maybe}")
        following = argv[i + 1] if i + 1 < len(argv) else None
        if (not has_value and (following is None or following.startswith("--"))
                and not isinstance(_base_value(key), bool)):  # absl's --flag for True
            raise SystemExit(f"error in the command line: {name} needs a value: "
                             f"{name}=VALUE")


def _bad_value(name: str, value: str) -> str:
    """"error in the command line: --config.num_train_steps=1e3: config.num_train_steps is an
    integer, got '1e3'", the type from `base_config` (absl's words: "invalid literal for
    int() with base 10", on two lines)."""
    wanted = _base_value(name.removeprefix("--config."))
    kind = {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(type(wanted), "of another type")
    return (f"error in the command line: {name}={value}: {name.removeprefix('--')} is {kind}, "
            f"got {value!r}")


def _bad_override(error: Exception, argv: list[str] = ()) -> str:
    message = _one_line(error)
    key = message.strip("'\"")
    if key.isidentifier():  # ml_collections' message, where no key is close to it
        message = _no_such_key(key, argv) or message
    elif close := re.fullmatch(r"'?(\w+)'? Did you mean \"(\w+)\" instead of .*", message):
        message = _no_such_key(close[1], argv, suggestion=close[2]) or message
    return f"error in the command line: {message}"


def _no_such_key(key: str, argv, suggestion: str | None = None) -> str | None:
    """"--config.model.preset: config.model has no key 'preset'; its keys: ..." (or "; did you
    mean 'SUGGESTION'?") for the override in `argv` whose group lacks `key`, the keys from
    `base_config` (every config file's); None if no override's group lacks it."""
    for arg in argv[1:]:
        name = arg.split("=", 1)[0]
        path = name.removeprefix("--config.").split(".")
        if not name.startswith("--config.") or key not in path:
            continue
        group = path[:path.index(key)]
        keys = every_key()
        for part in group:
            keys = keys.get(part) if isinstance(keys, ml_collections.ConfigDict) else None
        if isinstance(keys, ml_collections.ConfigDict) and key not in keys:
            where = ".".join(["config", *group])
            if suggestion:
                return f"{name}: {where} has no key {key!r}; did you mean {suggestion!r}?"
            return f"{name}: {where} has no key {key!r}; its keys: {', '.join(sorted(keys))}"
    return None


def _one_line(error: Exception) -> str:
    """The error's message on one line. A KeyError's str() is the repr of its message, and
    ml_collections' messages are such reprs again: a message that is a whole string literal
    is unquoted; a bare key stays quoted, and "'int' object has no attribute 'keys'" whole."""
    message = str(error)
    while len(message) > 1 and message[0] == message[-1] and message[0] in "'\"":
        try:
            inner = str(ast.literal_eval(message))
        except (ValueError, SyntaxError):
            break
        if " " not in inner:
            break
        message = inner
    return " ".join(message.split())


def loaded_config(config):
    """The ConfigDict that `--config` loaded, or a one-line SystemExit when its file did not
    load or an override does not apply (ml_collections defers both, for a config flag that
    `use_load_config_file` did not reach, to the config's first use, as a traceback)."""
    try:
        config.keys()
    except OSError as error:
        raise SystemExit(_cannot_load(error)) from None
    except _OVERRIDE_ERRORS as error:
        raise SystemExit(_bad_override(error, sys.argv)) from None
    return config


def _cannot_load(error: OSError) -> str:
    return f"error: cannot load --config: {str(error).strip().splitlines()[-1].strip()}"
