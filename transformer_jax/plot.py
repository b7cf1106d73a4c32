"""Learning curves: loss, BLEU and chrF, learning rate against step, wall time above.

    python -m transformer_jax.plot WORKDIR [WORKDIR ...] [--output=FILE.png]

draws one run, or up to 10 on one figure (one colour per run, no wall-time axis), from
their metrics.jsonl. A run also draws its own WORKDIR/curves.png at each evaluation and at
its end (run_log.py). matplotlib is imported only to draw (Agg, no display): importing
this module is cheap.
"""

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence

import numpy as np

from transformer_jax.commands import interrupt_in_one_line, output_file
from transformer_jax.output_paths import OutputPathError, writable_file

METRICS = "metrics.jsonl"
CURVES = "curves.png"
ELAPSED = "elapsed_s"  # the records' wall time: see RunLog
PANEL_INCHES = (5.0, 4.2)  # one panel's width and height; the figure is panels wide
DPI = 100
MAX_RUNS = 10  # matplotlib's colour cycle: an 11th run would take the 1st run's colour

Run = tuple[str, Sequence[dict]]  # a run's name and its records


class MetricsError(Exception):
    """A metrics.jsonl that is missing, empty or not made of records."""


@dataclasses.dataclass(frozen=True)
class Series:
    key: str  # the records' key
    label: str
    color: str  # when one run is drawn; several runs take one colour each
    linestyle: str = "-"
    marker: str = ""


@dataclasses.dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    yscale: str
    series: tuple[Series, ...]


PANELS = (
    # The training loss is label-smoothed (its entropy subtracted: 0 is its floor, §5.4);
    # the validation loss is plain cross-entropy: of two kinds, the legend says so.
    Panel("Loss", "loss per target token (nats)", "log",
          (Series("loss", "training: to the smoothed labels, floor 0", "C0"),
           Series("eval_loss", "validation: cross-entropy", "C1", "--", "o"))),
    Panel("BLEU and chrF (validation, beam search)", "score", "linear",
          (Series("eval_bleu", "BLEU", "C2", "-", "o"),
           Series("eval_chrf", "chrF", "C4", ":", "s"))),
    Panel("Learning rate", "learning rate", "linear",
          (Series("learning_rate", "learning rate", "C7"),)),
)


# -- reading -------------------------------------------------------------------------------

def parse_records(text: str, path: str) -> list[dict]:
    """The records of a metrics.jsonl's text. A half-written last line (a run stopped while
    writing it: no newline after it) is skipped with a one-line warning; any other bad line
    is a MetricsError."""
    lines = text.splitlines()
    last = len(lines) - 1 if text and not text.endswith("\n") else -1
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == last:
                print(f"warning: {path}: skipped its half-written last line", file=sys.stderr)
                continue
            raise MetricsError(f"{path}, line {i + 1}: not a JSON record") from None
        if not isinstance(record, dict) or "step" not in record:
            raise MetricsError(f"{path}, line {i + 1}: a record without a step")
        if not isinstance(record["step"], int) or isinstance(record["step"], bool):
            raise MetricsError(f"{path}, line {i + 1}: its step is not an integer "
                               f"({record['step']!r})")
        records.append(record)
    return records


def read_records(path: str) -> list[dict]:
    """The records of the metrics.jsonl at `path` (see `parse_records`)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise MetricsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise MetricsError(f"{path} is a folder, not a file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise MetricsError(f"{path}: cannot read it ({error})") from None
    return parse_records(text, path)


def load_run(workdir: str) -> list[dict]:
    """The records of a training run's WORKDIR, at least one."""
    if not os.path.exists(workdir):
        raise MetricsError(f"{workdir}: no such folder")
    if not os.path.isdir(workdir):
        raise MetricsError(f"{workdir} is a file, not a training run's folder")
    path = os.path.join(workdir, METRICS)
    if not os.path.exists(path):
        raise MetricsError(f"{workdir} holds no {METRICS} (is it a training run's --workdir?)")
    if not os.path.isfile(path) and not os.path.isdir(path):  # a FIFO would wait for a writer
        raise MetricsError(f"{path} is not a regular file")
    records = read_records(path)
    if not records:
        raise MetricsError(f"{path} holds no records yet")
    return records


def run_names(workdirs: Sequence[str]) -> list[str]:
    """Each workdir's folder name, or the path as given where two names are the same."""
    names = [os.path.basename(os.path.normpath(os.path.abspath(w))) for w in workdirs]
    if len(set(names)) < len(names):
        return [os.path.normpath(w) for w in workdirs]
    return names


# -- the data drawn ------------------------------------------------------------------------

def series(records: Sequence[dict], key: str) -> np.ndarray:
    """(step, value) rows of the records that carry `key`, by step: `(n, 2)`. Where a step
    has several (a file that holds the steps a resumed run did again), its last one."""
    by_step = {r["step"]: r[key] for r in records if isinstance(r.get(key), (int, float))
               and not isinstance(r.get(key), bool)}
    return np.array(sorted(by_step.items()), dtype=np.float64).reshape(-1, 2)


def wall_time(records: Sequence[dict]) -> np.ndarray:
    """(step, seconds) rows of the run's clock: the `elapsed_s` of each step's first record
    (the training record; evaluation comes after it), from (0, 0), where a run's clock
    starts. Rows whose time does not grow past the rows before are left out, so the
    mapping can be inverted: `(n, 2)`, n = 0 when no record has a time."""
    rows, seen = [(0.0, 0.0)], set()
    for r in records:
        seconds = r.get(ELAPSED)
        if r["step"] in seen or not isinstance(seconds, (int, float)):
            continue
        seen.add(r["step"])
        if r["step"] > rows[-1][0] and seconds > rows[-1][1]:
            rows.append((float(r["step"]), float(seconds)))
    return np.array(rows if len(rows) > 1 else [], dtype=np.float64).reshape(-1, 2)


def _piecewise_linear(x_known: np.ndarray, y_known: np.ndarray):
    """x -> y through the known points, continued beyond them along the end segments
    (an axis's limits reach past the data)."""
    def f(x):
        x = np.asarray(x, dtype=np.float64)
        y = np.interp(x, x_known, y_known)
        for end, inner, beyond in ((0, 1, x < x_known[0]), (-1, -2, x > x_known[-1])):
            slope = (y_known[end] - y_known[inner]) / (x_known[end] - x_known[inner])
            y = np.where(beyond, y_known[end] + (x - x_known[end]) * slope, y)
        return y
    return f


def _time_unit(seconds: float) -> tuple[str, float]:
    """A readable unit for a duration, and its length in seconds."""
    if seconds < 120:
        return "s", 1.0
    return ("min", 60.0) if seconds < 2 * 3600 else ("h", 3600.0)


def _duration(seconds: float) -> str:
    unit, length = _time_unit(seconds)
    return f"{seconds / length:.3g} {unit}"


# -- drawing -------------------------------------------------------------------------------

def curves_figure(runs: Sequence[Run]):
    """A matplotlib Figure of the runs' learning curves, one panel per kind of metric the
    records carry (loss; BLEU and chrF; learning rate), against step. One run: each series
    its colour and a wall-time axis on top. Several runs: one colour per run, one line
    style per series. Each line's gid is "RUN:KEY" (KEY the records' key)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [p for p in PANELS if any(len(series(records, s.key)) for _, records in runs
                                       for s in p.series)]
    if not panels:
        raise MetricsError("the records hold no loss, BLEU, chrF or learning rate to draw")
    figure = Figure(figsize=(PANEL_INCHES[0] * len(panels), PANEL_INCHES[1]), dpi=DPI,
                    layout="constrained")
    FigureCanvasAgg(figure)
    several = len(runs) > 1
    for ax, panel in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels):
        drawn = [s for s in panel.series
                 if any([_draw_series(ax, s, i, name, records, several)
                         for i, (name, records) in enumerate(runs)])]
        _style_panel(ax, panel, drawn, several)
        if not several:
            _add_wall_time_axis(ax, wall_time(runs[0][1]))
    _title(figure, runs)
    return figure


def _draw_series(ax, s: Series, index: int, name: str, records, several: bool) -> bool:
    rows = series(records, s.key)
    if not len(rows):
        return False
    label = s.label if several else f"{s.label} (last {rows[-1, 1]:.4g})"
    marker = s.marker or ("o" if len(rows) == 1 else "")  # one point: no line to see
    ax.plot(rows[:, 0], rows[:, 1], color=f"C{index}" if several else s.color,
            linestyle=s.linestyle, marker=marker, markersize=4, linewidth=1.6,
            label=label, gid=f"{name}:{s.key}")
    return True


def _style_panel(ax, panel: Panel, drawn: list[Series], several: bool) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_title(panel.title, fontsize=11, fontweight="bold")
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    ax.set_yscale(panel.yscale)
    ax.set_xlim(left=0)
    ax.grid(True, which="major", alpha=0.35)
    ax.spines["right"].set_visible(False)
    key, legend_at = panel.series[0].key, "best"
    if panel.yscale == "log":  # ticks at 1, 2, 5 (more within a decade) × 10^k, plainly
        low, high = ax.get_ylim()  # within one decade, 1, 2, 5 would leave a tick or two
        subs = (1.0, 2.0, 5.0) if high > 10 * low else (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0)
        ax.yaxis.set_major_locator(LogLocator(subs=subs))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        legend_at = "upper right"
    elif key == "learning_rate":  # tiny numbers: 2.5e-04 on each tick, not an offset
        ax.yaxis.set_major_formatter(FuncFormatter(
            lambda v, _: np.format_float_scientific(v, precision=3, trim="-") if v else "0"))
        ax.set_ylim(bottom=0)
    elif key == "eval_bleu":  # the whole scale: a 99.1 against a 99.8 is no cliff
        top = max(line.get_ydata().max() for line in ax.get_lines())
        top = min(104.0, 1.1 * top) if top > 0 else 100.0
        ax.set_ylim(-0.03 * top, top)  # room for the markers of a 0
    if several:  # the series' line styles here; the runs' colours in the figure's legend
        handles = [Line2D([], [], color="0.25", linestyle=s.linestyle, marker=s.marker,
                          markersize=4, label=s.label) for s in drawn]
        if len(handles) > 1:
            ax.legend(handles=handles, loc=legend_at, fontsize=8, framealpha=0.8)
    else:
        ax.legend(loc=legend_at, fontsize=8, framealpha=0.8)


def _add_wall_time_axis(ax, clock: np.ndarray) -> None:
    """A second step axis on top, labelled in the run's wall time (clock: `wall_time`)."""
    if not len(clock):
        return
    unit, length = _time_unit(clock[-1, 1])
    steps, times = clock[:, 0], clock[:, 1] / length
    to_step = _piecewise_linear(times, steps)
    top = ax.secondary_xaxis("top", functions=(_piecewise_linear(steps, times), to_step))
    top.xaxis.set_major_locator(_spread_ticks(to_step))
    top.set_xlabel(f"wall time ({unit})", color="0.35")
    top.tick_params(colors="0.35")


def _spread_ticks(to_step, spacing: int = 8):
    """A matplotlib Locator of round times whose places on the step axis are at least
    1/`spacing` of its width apart. The clock runs unevenly against the steps (the first
    step compiles, evaluations pause training), so evenly spaced times can fall on nearly
    the same step and their labels overprint one another."""
    from matplotlib.ticker import Locator, MaxNLocator

    class SpreadTicks(Locator):
        def __call__(self):
            return self.tick_values(*self.axis.get_view_interval())

        def tick_values(self, vmin, vmax):
            low, high = sorted((vmin, vmax))
            times = [t for t in MaxNLocator(nbins=10, steps=[1, 2, 2.5, 5, 10])
                     .tick_values(low, high) if low <= t <= high]
            left, right = to_step(np.array([low, high]))
            kept, last = [], -np.inf
            for time, step in zip(times, to_step(np.array(times, dtype=np.float64))):
                if step - last >= (right - left) / spacing:
                    kept.append(time)
                    last = step
            return np.array(kept)

    return SpreadTicks()


def _title(figure, runs: Sequence[Run]) -> None:
    from matplotlib.lines import Line2D

    def summary(records):
        times = [r[ELAPSED] for r in records if isinstance(r.get(ELAPSED), (int, float))]
        last = max(r["step"] for r in records)
        steps = f"{last:,} step{'s' if last != 1 else ''}"
        return steps + (f", {_duration(max(times))}" if times else "")

    if len(runs) == 1:
        name, records = runs[0]
        figure.suptitle(f"{name}: {summary(records)}", fontsize=13)
        return
    figure.suptitle(f"Learning curves of {len(runs)} runs", fontsize=13)
    handles = [Line2D([], [], color=f"C{i}", linewidth=2.5, label=f"{name} ({summary(records)})")
               for i, (name, records) in enumerate(runs)]
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(runs), 4),
                  frameon=False)


def save_png(figure, path: str, dpi: float | None = None) -> None:
    """Writes the figure as a PNG (at `dpi`; None: the figure's), whole or not at all
    (`commands.output_file`: a reader never sees half a file; /dev/stdout or a pipe is
    written straight to)."""
    with output_file(path, "wb") as f:
        figure.savefig(f, format="png", dpi=dpi)


def write_curves(path: str, runs: Sequence[Run]) -> None:
    """Draws the runs' learning curves (`curves_figure`) into the PNG at `path`."""
    save_png(curves_figure(runs), path)


# -- the command line ----------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """Checks the command line, reads the runs, draws them and writes the PNG."""
    parser = argparse.ArgumentParser(
        prog="python -m transformer_jax.plot", formatter_class=argparse.RawTextHelpFormatter,
        description="Draw the learning curves of training runs from their metrics.jsonl: the "
                    "loss (training and\nvalidation), BLEU and chrF, and the learning rate "
                    "against step; one run also gets\nits wall time on a second axis.",
        epilog="e.g. python -m transformer_jax.plot runs/base runs/big --output=compare.png")
    parser.add_argument("workdirs", nargs="+", metavar="WORKDIR",
                        help=f"a run's --workdir (at most {MAX_RUNS})")
    parser.add_argument("--output", metavar="FILE.png",
                        help=f"default: WORKDIR/{CURVES} for one run, ./{CURVES} for several")
    args = parser.parse_args(argv)
    if args.output is not None and not args.output.lower().endswith(".png"):
        parser.error(f"--output needs a .png file name, got {args.output!r}")
    if len(args.workdirs) > MAX_RUNS:
        parser.error(f"{len(args.workdirs)} runs: at most {MAX_RUNS} fit one figure, one "
                     f"colour each")
    real = [os.path.realpath(w) for w in args.workdirs]
    if twice := next((w for w, r in zip(args.workdirs, real) if real.count(r) > 1), None):
        parser.error(f"{twice} is given twice (two names of one folder); give each run once")
    target = (args.output if args.output is not None else
              os.path.join(args.workdirs[0], CURVES) if len(real) == 1 else CURVES)
    try:
        runs = list(zip(run_names(args.workdirs), map(load_run, args.workdirs)))
        output = writable_file(target, "--output")
        figure = curves_figure(runs)
    except (MetricsError, OutputPathError) as error:
        return _fail(str(error))
    except ImportError as error:
        return _fail(f"drawing needs matplotlib ({error}): pip install 'matplotlib>=3.8'")
    for name, records in runs:
        if not any(len(series(records, s.key)) for p in PANELS for s in p.series):
            print(f"warning: {name} has no loss, BLEU, chrF or learning rate to draw",
                  file=sys.stderr)
    try:
        save_png(figure, output)
    except OSError as error:
        return _fail(f"cannot write {output}: {error.strerror or error}")
    print(f"wrote {target}")
    return 0


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    with interrupt_in_one_line():
        sys.exit(main())
