"""`python -m transformer_jax`: build a preset, count it, run it once."""

import os
import re

import pytest

from transformer_jax.__main__ import main
from transformer_jax.model_config import get_model_config


def test_prints_parameter_count_and_runs_forward(capsys):
    """The printed total is the hand count for tiny with V = 50; the forward shape is right."""
    main(["--preset=tiny", "--vocab_size=50", "--batch=3", "--length=5"])
    out = capsys.readouterr().out
    c = get_model_config("tiny", vocab_size=50)
    d, f, v, layers = c.d_model, c.d_ff, c.vocab_size, c.num_layers
    attention = 4 * (d * d + d)
    ffn = 2 * d * f + f + d
    expected = v * d + layers * (attention + ffn + 2 * 2 * d) + layers * (
        2 * attention + ffn + 3 * 2 * d)
    total = int(re.search(r"total:\s+([\d,]+)", out).group(1).replace(",", ""))
    assert total == expected
    assert "logits (3, 5, 50) float32" in out


def test_bad_override_is_a_clear_usage_error(capsys):
    """vocab_size < 2 exits with status 2 and names the field, without a traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--preset=tiny", "--vocab_size=1"])
    assert exit_info.value.code == 2
    assert "ModelConfig.vocab_size must be at least 2" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, shown", [("--batch", "0", "0"), ("--length", "-3", "-3"),
                                                ("--length", "x", "'x'")])
def test_a_count_that_is_not_positive_is_a_usage_error(flag, value, shown, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([f"{flag}={value}"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m transformer_jax: error: argument {flag}: must be a positive integer, "
        f"got {shown}")


@pytest.mark.parametrize("args, message", [
    (["--vocab_size=10000000000"],
     "ModelConfig.vocab_size must be below 2**31 (ids are int32), got 10000000000"),
    (["--batch=100000", "--length=100000"],
     "--batch × --length is 10,000,000,000 tokens; at most 2,147,483,647 (int32 ids)")])
def test_sizes_past_int32_ids_are_usage_errors(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == f"python -m transformer_jax: error: {message}"


def overcommitted_or_large() -> str:
    """Why a 256 GB allocation may not fail here ("" where it fails): the kernel grants any
    allocation (vm.overcommit_memory 1, and the process is killed when it writes), or the
    machine has that much memory."""
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            if f.read().strip() == "1":
                return "vm.overcommit_memory is 1: the allocation succeeds, its use is killed"
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{memory / 1e9:.0f} GB of memory" if memory > 200e9 else ""


@pytest.mark.skipif(bool(overcommitted_or_large()), reason=overcommitted_or_large())
def test_parameters_too_large_for_memory_are_one_line(capsys):
    """V = 2·10⁹: the embedding alone is 256 GB of float32; its initialization fails (XLA:
    INTERNAL, "Out of memory"), before any forward pass, and is said in one line."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--vocab_size=2000000000"])
    message = str(exit_info.value.code)
    assert message.startswith("error: the model and the forward pass of 2 x 16 tokens do not "
                              "fit in memory (")
    assert "256000000000 bytes" in message and "\n" not in message
    assert "total: 64,000,042,752 parameters" in capsys.readouterr().out  # 2e9 × 32 + the rest


def test_a_forward_pass_too_large_for_memory_is_one_line(capsys):
    """64 rows of 20,000 tokens: the tiny model's forward pass would take 1.6 TB (its
    (B, N, S, S) scores); XLA refuses the allocation, and the command says so and what to
    change."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--batch=64", "--length=20000"])
    message = str(exit_info.value.code)
    assert message.startswith("error: the model and the forward pass of 64 x 20000 tokens "
                              "do not fit in memory (RESOURCE_EXHAUSTED")
    assert message.endswith("choose a smaller --batch, --length or --vocab_size")
