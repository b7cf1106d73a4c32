"""python -m transformer_jax.benchmark SUITE [--quick] [--json=FILE] [--plot=FILE.png]
                                    [--markdown] [--profile=DIR]
python -m transformer_jax.benchmark model [--models=base,big] [--dtypes=bfloat16]
                                         [--strategies=pmap,sharded]
                                         [--vary FIELD=V1,V2 ...] [--loss-chunks=0,4096]
python -m transformer_jax.benchmark decode [--dtypes=float32,bfloat16] [--searches=greedy,beam4]
                                          [--vary FIELD=V1,V2 ...]
python -m transformer_jax.benchmark decode --peers [--workdir=DIR]
python -m transformer_jax.benchmark SUITE --from-json=FILE [--plot=FILE.png] [--markdown]"""

import signal

# Ctrl-C while JAX is imported ends the command at once and quietly, as it would a C
# program; from main on, interrupt_in_one_line says so in one line (as translate.py). Not
# where this module is imported (the tests): only as the command.
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import argparse
import glob
import importlib
import importlib.util
import json
import os
import sys

from transformer_jax import profiling
from transformer_jax.benchmark import SUITES, machine, plot, report, timing
from transformer_jax.benchmark.decode import beam_size
from transformer_jax.benchmark.model import chosen_cases, parse_vary
from transformer_jax.commands import interrupt_in_one_line, write_stdout_and_go_on
from transformer_jax.model_config import DTYPES
from transformer_jax.output_paths import OutputPathError, writable_file, writable_folder
from transformer_jax.run_config import STRATEGIES


def parse_args(argv):
    """The command line's arguments, each checked before any suite runs (a bad one is
    argparse's usage and one line, exit status 2): the flags fit the suite, their lists
    parse, and the output files can be written."""
    parser = _parser()
    args = parser.parse_args(argv)
    _check_flags_fit_the_suite(parser, args)
    if args.from_json is not None:  # before JAX's backend starts: a GPU may be busy
        args.from_json = _earlier_run(parser, args)
    else:
        _parse_lists(parser, args)
    _check_outputs(parser, args)
    return args


SUITE_HELP = {
    "attention": "each attention implementation by length, head dim, dtype, mask; TFLOP/s",
    "model": "the whole train step (forward, backward, Adam) of each model; tokens/s, MFU",
    "decode": "greedy and beam search, with the key/value cache and without; tokens/s",
    "pipeline": "prepared ids to packed and bucketed batches, beside grain's packers",
    "compare": "our train step and attention beside PyTorch's and Flax's, side by side",
    "loss": "the output layer and label-smoothed loss: whole logits, chunks, optax",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_jax.benchmark",
        description="Time the compiled pieces of transformer_jax; see docs/benchmarks.md "
                    "and BENCHMARKS.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="suites:\n" + "".join(
            f"  {name:10s} {what}\n" for name, what in SUITE_HELP.items()))
    parser.add_argument("suite", choices=SUITES, help="what to time (below)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes and few repetitions: a check that runs in seconds")
    parser.add_argument("--json", metavar="FILE",
                        help="also write every figure to FILE (rewritten as each row is "
                             "measured: a run stopped part-way keeps its rows)")
    parser.add_argument("--markdown", action="store_true",
                        help="print the table as Markdown (for BENCHMARKS.md)")
    parser.add_argument("--profile", metavar="DIR",
                        help="trace the suite with the JAX profiler into DIR (new or empty; "
                             "not for pipeline) and print where the time went, per kind of "
                             "XLA operation")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also draw a PNG (attention: TFLOP/s against sequence length)")
    parser.add_argument("--from-json", metavar="FILE",
                        help="time nothing: print the rows and notes of an earlier run of the "
                             "suite, its --json FILE (and draw them with --plot)")
    parser.add_argument("--peers", action="store_true",
                        help="decode: our search beside CTranslate2's on the same weights and "
                             "sentences (needs the serve extra)")
    parser.add_argument("--workdir", help="decode --peers: the trained run whose test split "
                                          "it translates (default: runs/default, if trained)")
    parser.add_argument("--models", metavar="NAMES",
                        help="model: time only these of its models (comma-separated)")
    parser.add_argument("--dtypes", metavar="D1,D2",
                        help="attention, model and decode: time these dtypes, of "
                             f"{', '.join(DTYPES)} (default: the suite's for this backend)")
    parser.add_argument("--strategies", metavar="S1,S2",
                        help=f"model: time the step under these of {', '.join(STRATEGIES)} "
                             f"(default: both, but sharded alone on one accelerator)")
    parser.add_argument("--searches", metavar="S1,S2",
                        help="decode: time these searches, greedy or beamK with beam size K "
                             "(default: greedy,beam4)")
    parser.add_argument("--vary", metavar="FIELD=V1,V2", action="append", default=[],
                        help="model and decode: time the step, or each search, with each "
                             "value of this ModelConfig field, e.g. --vary "
                             "dropout_bits=32,16,8, or of one of XLA's options, e.g. --vary "
                             "xla_gpu_enable_cublaslt=false,true, or of JAX's, e.g. --vary "
                             "jax_threefry_gpu_kernel_lowering=false,true (repeatable: every "
                             "combination; values separated by ; where one holds a comma)")
    parser.add_argument("--loss-chunks", metavar="N1,N2",
                        help="model: time the step with each of these loss_chunk_size "
                             "values (target tokens per chunk of the output layer and loss; "
                             "0: the whole logits; default 0 on CPUs, 0,4096 on accelerators, "
                             "0,64 with --quick)")
    return parser


def _check_flags_fit_the_suite(parser, args) -> None:
    if args.peers and args.suite != "decode":
        parser.error("--peers is for the decode suite")
    model_flags = (args.models, args.loss_chunks, args.strategies)
    if any(flag is not None for flag in model_flags) and args.suite != "model":
        parser.error("--models, --loss-chunks and --strategies are for the model suite")
    for flag, suites in (("vary", ("model", "decode")),
                         ("dtypes", ("attention", "model", "decode")), ("searches", ("decode",))):
        if getattr(args, flag) not in (None, []) and args.suite not in suites:
            named = " and ".join([", ".join(suites[:-1]), suites[-1]] if len(suites) > 1
                                 else suites)
            parser.error(f"--{flag} is for the {named} suite" + ("s" if len(suites) > 1 else ""))
        if getattr(args, flag) not in (None, []) and args.peers:
            parser.error(f"--{flag} is not for decode --peers, which times one search of "
                         f"its own")
    if args.profile is not None and args.suite == "pipeline":
        parser.error("--profile traces compiled calls; the pipeline suite times the input "
                     "pipeline on the host")
    if args.workdir is not None and not args.peers:
        parser.error("--workdir is for decode --peers")
    if args.workdir is not None and args.quick:
        parser.error("--workdir is not read with --quick, which times random weights only")
    if args.workdir is not None and not os.path.isdir(os.path.join(args.workdir, "checkpoints")):
        parser.error(f"--workdir={args.workdir} has no checkpoints (a training run's --workdir)")


# What only a measurement reads: refused beside --from-json, which times nothing.
MEASURING = ("quick", "json", "profile", "workdir", "models", "dtypes", "strategies",
             "searches", "vary", "loss_chunks")


def _earlier_run(parser, args) -> dict:
    """The report in --from-json's file: a suite's --json, of this suite (`decode --peers`
    for --peers), its rows tables of values, and with --plot a row that has the value
    drawn; no flag that only a measurement reads. Nothing here starts JAX's backend."""
    path = args.from_json
    if given := [name for name in MEASURING if getattr(args, name) not in (None, False, [])]:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        parser.error(f"{flags}: not read with --from-json, which times nothing (it shows "
                     f"the rows {path} holds)")
    try:
        with open(path) as f:
            earlier = json.load(f)
    except OSError as error:
        parser.error(f"--from-json {path}: {error.strerror}")
    except (ValueError, UnicodeDecodeError):
        earlier = None
    if not (isinstance(earlier, dict) and isinstance(earlier.get("results"), list)
            and all(isinstance(row, dict) for row in earlier["results"])
            and isinstance(earlier.get("notes", []), list)):
        parser.error(f"--from-json {path} is not a benchmark's --json file (JSON with its "
                     f"suite, its results as rows and its notes)")
    wanted = _name(args)
    if earlier.get("suite") != wanted:
        parser.error(f"--from-json {path} holds the rows of {earlier.get('suite')!r}, not "
                     f"of {wanted!r}")
    drawn = plot.HEADLINE[args.suite]
    if args.plot and not any(isinstance(row.get(drawn), (int, float))
                             for row in earlier["results"]):
        parser.error(f"--plot: no row of {path} has {drawn}, the value it draws")
    return earlier


def _parse_lists(parser, args) -> None:
    """--models, --dtypes, --searches, --strategies, --loss-chunks and --vary as lists and
    values, in place; the models and every combination of --vary checked against what the
    backend times."""
    args.models = _names(parser, "--models", args.models)
    args.dtypes = None if args.dtypes is None else _dtypes(parser, args.dtypes)
    args.searches = _names(parser, "--searches", args.searches)
    args.strategies = _names(parser, "--strategies", args.strategies)
    if unknown := [name for name in args.strategies or () if name not in STRATEGIES]:
        parser.error(f"--strategies takes {', '.join(STRATEGIES)}, "
                     f"got {', '.join(map(repr, unknown))}")
    for search in args.searches or ():
        try:
            beam_size(search)
        except ValueError as error:
            parser.error(f"--searches: {error}")
    if args.loss_chunks is not None:
        args.loss_chunks = _loss_chunks(parser, args.loss_chunks)
    try:
        args.vary = parse_vary(args.vary)
        chosen, _ = chosen_cases(args.quick, args.models, args.vary)
    except ValueError as error:
        parser.error(str(error))
    if args.suite == "model":
        _check_devices(parser, chosen)


def _check_devices(parser, chosen) -> None:
    """The model suite splits each case's rows over every device: a count that does not
    divide them is a usage error now, not a traceback after the first compile."""
    import jax

    devices = jax.local_device_count()
    if split := [f"{case.name} ({case.batch})" for case in chosen if case.batch % devices]:
        parser.error(f"the model suite splits its rows over this process's {devices} "
                     f"devices, and the rows of {', '.join(split)} do not split so; time on a "
                     f"count that divides them (CUDA_VISIBLE_DEVICES on GPUs, XLA_FLAGS="
                     f"--xla_force_host_platform_device_count=N on CPUs)")


def _check_outputs(parser, args) -> None:
    """--plot's name, and --json's, --plot's and --profile's folders (made now, not after the
    suite has run for minutes); a note where --vary replaces what --profile compiles with."""
    if args.profile and (replaced := sorted(set(args.vary) & set(profiling.TRACEABLE))):
        print(f"note: --vary {', '.join(replaced)} replaces what --profile compiles with "
              f"({profiling.TRACEABLE}): on a GPU, its profile by part may then show CUDA "
              f"graphs rather than the model's parts", file=sys.stderr)
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        parser.error(f"--plot needs a .png file name, got {args.plot!r}")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib: pip install 'transformer_jax[bench]'")
    try:
        if args.json is not None:
            args.json = writable_file(args.json, "--json")
        if args.plot is not None:
            args.plot = writable_file(args.plot, "--plot")
        if args.profile is not None:
            args.profile = writable_folder(args.profile, "--profile")
    except OutputPathError as error:
        parser.error(str(error))
    if args.json is not None and args.json == args.plot:
        parser.error(f"--json and --plot name one file, {args.json}; give each its own")
    if args.profile is not None and os.listdir(args.profile):
        parser.error(f"--profile {args.profile} is not empty; give a new folder (its "
                     f"summary would add the traces already there)")


def _loss_chunks(parser, text: str) -> tuple[int, ...]:
    """(0, 4096) from "0,4096": each a loss_chunk_size, an integer 0 or more (repeated
    values are timed again: 0,4096,0,4096 alternates them)."""
    try:
        chunks = tuple(int(value) for value in text.split(","))
    except ValueError:
        chunks = ()
    if not chunks or min(chunks) < 0:
        parser.error(f"--loss-chunks takes integers 0 or more (target tokens per "
                     f"chunk; 0: the whole logits), e.g. 0,4096; got {text!r}")
    return chunks


def _dtypes(parser, text: str) -> tuple[str, ...]:
    """("float32", "bfloat16") from "float32,bfloat16": each one of ModelConfig's dtypes."""
    dtypes = tuple(value.strip() for value in text.split(","))
    if unknown := [dtype for dtype in dtypes if dtype not in DTYPES]:
        parser.error(f"--dtypes takes {', '.join(DTYPES)}, got {', '.join(map(repr, unknown))}")
    return dtypes


def _names(parser, flag: str, text: str | None) -> tuple[str, ...] | None:
    """("base", "big") from "base,big"; None when the flag is not given. An empty name
    ("base,", or "" from an unset shell variable) is a usage error."""
    if text is None:
        return None
    names = tuple(name.strip() for name in text.split(","))  # "tiny, small" as --dtypes
    if not all(names):
        parser.error(f"{flag}={text!r} holds an empty name; give names separated by commas")
    return names


def main(argv=None) -> int:
    """Runs the suite the command line names, prints its table and notes, then writes the
    --json and --plot files and the --profile summary (with --from-json: shows an earlier
    run's instead, timing nothing). The --json file is written as each
    row is measured too (`report.streaming`): a run stopped part-way keeps those rows."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.from_json is not None:
        return _show(args, args.from_json)
    if args.suite == "compare":
        # torch shares the GPU: JAX must not take 75 % of its memory up front (read when
        # the backend starts, which is below).
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    about = machine.describe()
    name = _name(args)
    write_stdout_and_go_on(f"{name} on {_machine(about, args.quick)}\n")
    timing.trace_timed_calls(args.profile)
    with report.streaming(args.json, name, quick=args.quick, argv=argv) as streamed:
        try:
            rows, notes = _run_suite(args)
        except BaseException:
            if streamed:
                kept = f"{len(streamed)} row" + "s" * (len(streamed) > 1)
                print(f"{args.json} keeps the {kept} measured before the stop "
                      f"(\"complete\": false)", file=sys.stderr, flush=True)
            raise
    _print_rows(args, rows, notes)
    if args.json:
        report.write_json(args.json, report.document(name, rows, quick=args.quick,
                                                     notes=notes, argv=argv))
        write_stdout_and_go_on(f"wrote {args.json}\n")
    _draw(args, rows, about, args.quick)
    if args.profile:
        write_stdout_and_go_on(_profile_summary(args.profile))
    return 0


def _name(args) -> str:
    """What the command runs, as its --json file's "suite" names it: "decode --peers" too."""
    return "decode --peers" if args.peers else args.suite


def _show(args, earlier: dict) -> int:
    """--from-json: an earlier run's rows and notes printed, and drawn with --plot, as that
    run printed and drew them; nothing is timed. A file without its machine (written by
    hand) says so."""
    about = earlier.get("machine")
    about = about if isinstance(about, dict) and about.get("device_kind") else {}
    where = f"on {_machine(about, earlier.get('quick'))}" if about else "(no machine named)"
    stopped = " (stopped part-way: \"complete\": false)" if earlier.get("complete") is False else ""
    write_stdout_and_go_on(f"{earlier['suite']} as measured {earlier.get('date') or '(no date)'} "
                           f"{where}{stopped}\n")
    _print_rows(args, earlier["results"], [str(note) for note in earlier.get("notes", [])])
    _draw(args, earlier["results"], about, earlier.get("quick"))
    return 0


def _machine(about: dict, quick: bool) -> str:
    """The machine of `machine.describe()` in a line."""
    return (f"{_devices(about)} ({about.get('backend')}, {about.get('cpu_count')} CPUs, "
            f"{about.get('processor')}), jax {about.get('jax')}" + (" [quick]" if quick else ""))


def _devices(about: dict) -> str:
    """"1x NVIDIA H100 80GB HBM3": the devices of `machine.describe()`, their count if known."""
    count = about.get("device_count")
    return (f"{count}x " if count else "") + str(about.get("device_kind"))


def _print_rows(args, rows: list[dict], notes: list[str]) -> None:
    write_stdout_and_go_on((report.markdown(rows) if args.markdown else report.table(rows))
                           + "".join(f"\n  {note}" for note in notes) + "\n")


def _draw(args, rows: list[dict], about: dict, quick: bool) -> None:
    """--plot's picture of `rows`, titled with the machine that measured them (if named)."""
    if args.plot:
        named = _devices(about) if about else ""
        plot.save(args.suite, rows, args.plot, name=_name(args),
                  where=" ".join(filter(None, [named, "[quick]" if quick else ""])))
        write_stdout_and_go_on(f"wrote {args.plot}\n")


def _run_suite(args) -> tuple[list[dict], list[str]]:
    """(rows, notes) of the suite, or of decode --peers."""
    if args.peers:
        from transformer_jax.benchmark import decode_peers

        return decode_peers.run(quick=args.quick, workdir=args.workdir or "runs/default")
    suite = importlib.import_module(f"transformer_jax.benchmark.{args.suite}")
    options = {"model": dict(models=args.models, dtypes=args.dtypes, vary=args.vary,
                             loss_chunks=args.loss_chunks, strategies=args.strategies),
               "decode": dict(dtypes=args.dtypes, searches=args.searches, vary=args.vary),
               "attention": {} if args.dtypes is None else dict(dtypes=args.dtypes),
               }.get(args.suite, {})
    rows, notes = suite.run(quick=args.quick, **options)
    return rows, notes + _inert_options(args.vary or {})


def _inert_options(vary: dict) -> list[str]:
    """A note naming the --vary options of XLA's GPU backend when this one is another: XLA
    takes them and compiles the same program, so their rows differ by noise alone."""
    import jax

    backend = jax.default_backend()
    inert = [name for name in vary if name.startswith("xla_gpu_")] if backend != "gpu" else []
    return [f"{', '.join(inert)}: XLA's GPU backend's, not this {backend} backend's: each "
            f"value compiles the same program, and their rows differ by noise"] if inert else []


def _profile_summary(trace_dir: str) -> str:
    """Where the timed calls spent their time: by kind of operation over all the traces,
    then by part of the model for each program traced apart (`timing.traced_as`)."""
    text = (f"\nwhere the timed calls spent their time (all threads; traces in "
            f"{trace_dir}):\n{report.table(profiling.summarize(trace_dir))}\n")
    for program in sorted(glob.glob(os.path.join(trace_dir, "*", profiling.PROGRAM_FILE))):
        folder = os.path.dirname(program)
        with open(program) as f:
            parts = profiling.summarize_parts(folder, f.read())
        text += (f"\n{os.path.basename(folder)}: the program's operations by part of the "
                 f"model\n{report.table(parts)}\n")
    return text


if __name__ == "__main__":
    with interrupt_in_one_line():
        sys.exit(main())
