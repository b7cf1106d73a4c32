"""The lines a training run says (trainer.py) besides its records: what it trains and on
what, what it will not do, where the time to its first step went, what a profile found,
where its results are.

    start_line(config, model_config, rows=96, software=provenance.software(), first=0,
               parameters=63_082_496)   # configs/wmt14_ende_base.py on a CPU:
    # 'training steps 1-100000: 63,082,496 parameters (6 layers of width 512, float32) on
    #  1 cpu device, pmap; 96 packed rows of 256 + 256 tokens per update; transformer_jax
    #  0.1.0 (4347b02dc1a4+dirty), jax 0.10.2'
"""

import os
import sys
import time

import jax


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def start_line(config, model_config, *, rows: int, software: dict, first: int,
               parameters: int) -> str:
    """What the run trains (`parameters` of them), on what, from which step (`first`):
    the line before its first step. `rows`: a process's rows per update; `software`:
    `provenance.software()`."""
    c, m = config, model_config
    devices = jax.devices()
    batches = (f"{rows * jax.process_count()} packed rows of "
               f"{c.data.max_source_length} + {c.data.max_target_length} tokens per update"
               if c.data.batching == "packed" else "bucketed batches (above)")
    micro = (f" in {c.accumulation_steps} micro-batches" if c.accumulation_steps > 1
             else "")
    hosts = f" in {jax.process_count()} processes" if jax.process_count() > 1 else ""
    commit, plus, dirty = (software["commit"] or "").partition("+")
    commit = f" ({commit[:12]}{plus}{dirty})" if commit else ""
    return (f"{f'resumed at step {first}; ' if first else ''}training steps {first + 1}"
            f"-{c.num_train_steps}: {parameters:,} parameters "
            f"({_plural(m.num_layers, 'layer')} of width {m.d_model}, {m.dtype}) on "
            f"{_plural(len(devices), devices[0].device_kind + ' device')}{hosts}, "
            f"{c.parallelism}; {batches}{micro}; transformer_jax "
            f"{software['transformer_jax']}{commit}, jax {software['jax']}")


def opening_lines(config, model_config, *, rows: int, software: dict, first: int,
                  parameters: int, evaluable: bool, checkpoints: str) -> list[str]:
    """What the run says before its first step (`first`, the step it starts from): what
    it trains (`start_line`), or that it has nothing to train (its newest checkpoint in
    the folder `checkpoints`), and what it will not do (`evaluable`: the validation split
    has pairs)."""
    c, lines = config, []
    if first < c.num_train_steps:
        lines.append(start_line(c, model_config, rows=rows, software=software, first=first,
                                parameters=parameters))
    if model_config.layer_norm_implementation == "pallas" and jax.default_backend() != "gpu":
        lines.append(f"warning: model.layer_norm_implementation='pallas' runs its kernels "
                     f"in Pallas's interpreter on {jax.default_backend()}, slowly; 'xla' "
                     f"computes the same norm at full speed there")
    if not evaluable:
        lines.append("nothing to evaluate (the validation split is empty): "
                     "the run logs no evaluation records")
    elif c.num_eval_batches == 0:
        lines.append("nothing to evaluate (num_eval_batches=0): "
                     "the run logs no eval_loss, eval_accuracy or eval_perplexity")
    if first >= c.num_train_steps:
        lines.append(f"nothing to train: {checkpoints}/{first} is at step "
                     f"{first}, and num_train_steps is {c.num_train_steps} (raise "
                     f"--config.num_train_steps to train on)")
    return lines


def finished_line(workdir: str, step: int, checkpoints: str) -> str:
    """The line after a run's last step: where its results are, and the commands that use
    them (with this interpreter where it lies under the working directory: make's
    .venv/bin/python; the scripts beside the train.py that runs: `_script`)."""
    python = os.path.relpath(sys.executable) if sys.executable else os.pardir
    python = "python" if python.startswith(os.pardir) else python
    return (f"trained to step {step}: saved to {checkpoints}/{step}, curves in "
            f"{workdir}/curves.png; translate with {python} {_script('translate.py')} "
            f"--workdir={workdir}, score the test split with {python} "
            f"{_script('evaluate.py')} --workdir={workdir}")


def _script(name: str) -> str:
    """The script `name` as the working directory reaches it: beside the train.py that
    runs (`python path/to/train.py` from any folder: its path, relative where it lies under
    the working directory); its bare name where no train.py runs (`tj.train` in a notebook)."""
    main = sys.argv[0] if sys.argv else ""
    if os.path.basename(main) != "train.py":
        return name
    path = os.path.join(os.path.dirname(os.path.abspath(main)), name)
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def first_step_line(step: int, starts: tuple, opened: float, built: float,
                    drawing_s: float | None) -> str:
    """Where the time to the first step went: with the process's start (`starts` is
    (launched or None, the run's start)), Python, the imports and JAX's devices; the data
    (reading, or preparing on a first start), the state (built, `drawing_s` of it compiling
    and drawing fresh parameters, or restored: `drawing_s` None; and placed on the
    devices), the step itself (compiling it, unless the compilation cache holds it, and
    running it)."""
    now = time.monotonic()
    launched, started = starts
    if launched is None:
        before = f"step {step} done {now - started:.1f} s after the start: "
    else:
        before = (f"step {step} done {now - launched:.1f} s after the process started: "
                  f"{started - launched:.1f} s starting Python, the imports and the devices, ")
    state = ("restoring the state" if drawing_s is None else
             f"building the state ({drawing_s:.1f} s of it compiling and drawing its parameters)")
    return (f"{before}{opened - started:.1f} s reading or preparing the data, "
            f"{built - opened:.1f} s {state}, {now - built:.1f} s compiling and running the step")


def profile_line(summary: dict) -> str:
    """One line of a `StepTrace` summary: wall and device time per step, the top operations."""
    top = ", ".join(f"{op['operation']} {op['share']:.0%}" for op in summary["operations"][:3])
    parts = ", ".join(f"{p['pass']} {p['part']} {p['share']:.0%}"
                      for p in summary.get("parts", [])[:3])
    return (f"profiled steps {summary['first_step']}-{summary['last_step']} into "
            f"{summary['trace']}: {summary['wall_ms_per_step']:.1f} ms per step, the device "
            f"busy {summary['busy_ms_per_step']:.1f} ms and idle {summary['idle_share']:.0%} "
            f"of it; most time in {top}" + (f"; by part: {parts}" if parts else "")
            + " (summary.json there)")
