"""Learning curves: the lines drawn are the records, the wall-time axis is the records'
clock, the PNG is whole, and the command line fails in one line."""

import errno
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from transformer_jax import plot
from transformer_jax.output_paths import OutputPathError, writable_file, writable_folder

# A run logging every 10 steps, evaluating (loss, then BLEU) at steps 20 and 40.
RECORDS = [
    {"step": 10, "loss": 4.0, "learning_rate": 1e-4, "elapsed_s": 12.0},
    {"step": 20, "loss": 2.0, "learning_rate": 2e-4, "elapsed_s": 14.0},
    {"step": 20, "eval_loss": 2.5, "eval_accuracy": 0.5, "elapsed_s": 15.0},
    {"step": 20, "eval_bleu": 10.0, "eval_chrf": 30.0, "elapsed_s": 17.0},
    {"step": 30, "loss": 1.0, "learning_rate": 1.5e-4, "elapsed_s": 19.0},
    {"step": 40, "loss": 0.5, "learning_rate": 1.25e-4, "elapsed_s": 21.0},
    {"step": 40, "eval_loss": 1.25, "eval_accuracy": 0.75, "elapsed_s": 22.0},
    {"step": 40, "eval_bleu": 20.0, "eval_chrf": 45.0, "elapsed_s": 24.0},
]
NO_BLEU = [r for r in RECORDS if "eval_bleu" not in r]


def lines_by_gid(ax) -> dict[str, np.ndarray]:
    return {line.get_gid(): line.get_xydata() for line in ax.get_lines()}


def write_run(folder, records, tail: str = ""):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return folder


def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_each_line_is_the_records_of_its_key():
    figure = plot.curves_figure([("run", RECORDS)])
    loss, quality, rate = figure.axes[:3]
    assert [ax.get_title() for ax in (loss, quality, rate)] == [
        "Loss", "BLEU and chrF (validation, beam search)", "Learning rate"]
    assert loss.get_yscale() == "log"
    np.testing.assert_array_equal(lines_by_gid(loss)["run:loss"],
                                  [[10, 4.0], [20, 2.0], [30, 1.0], [40, 0.5]])
    np.testing.assert_array_equal(lines_by_gid(loss)["run:eval_loss"], [[20, 2.5], [40, 1.25]])
    assert lines_by_gid(quality).keys() == {"run:eval_bleu", "run:eval_chrf"}
    np.testing.assert_array_equal(lines_by_gid(quality)["run:eval_bleu"], [[20, 10.0], [40, 20.0]])
    np.testing.assert_array_equal(lines_by_gid(quality)["run:eval_chrf"], [[20, 30.0], [40, 45.0]])
    np.testing.assert_array_equal(lines_by_gid(rate)["run:learning_rate"],
                                  [[10, 1e-4], [20, 2e-4], [30, 1.5e-4], [40, 1.25e-4]])
    assert [t.get_text() for t in loss.get_legend().get_texts()] == [
        "training: to the smoothed labels, floor 0 (last 0.5)",
        "validation: cross-entropy (last 1.25)"]


def visible_tick_labels(ax) -> list[str]:
    ax.figure.canvas.draw()
    low, high = ax.get_ylim()
    return [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks())
            if low <= v <= high and t.get_text()]


def test_the_log_loss_axis_is_labelled_within_a_decade_and_across_several():
    """Losses within one decade (1.3 to 6) get ticks at 1.5, 2, 3, 4, 5 (1, 2, 5 would label
    two of them); over two decades, 1, 2 and 5 of each."""
    narrow = [{"step": s, "loss": v, "elapsed_s": s} for s, v in ((10, 6.0), (20, 1.3))]
    loss = plot.curves_figure([("run", narrow)]).axes[0]
    assert visible_tick_labels(loss) == ["1.5", "2", "3", "4", "5"]
    wide = [{"step": s, "loss": v, "elapsed_s": s} for s, v in ((10, 60.0), (20, 0.3))]
    loss = plot.curves_figure([("run", wide)]).axes[0]
    assert visible_tick_labels(loss) == ["0.5", "1", "2", "5", "10", "20", "50"]
    between = [{"step": s, "loss": v, "elapsed_s": s} for s, v in ((10, 20.0), (20, 0.5))]
    loss = plot.curves_figure([("run", between)]).axes[0]  # 40 times: more than a decade
    assert visible_tick_labels(loss) == ["0.5", "1", "2", "5", "10", "20"]


def test_the_wall_time_axis_maps_steps_to_the_recorded_seconds():
    """The clock is each step's first record's time, from (0, 0); the axis on top of each
    panel shows, over any step range, the seconds recorded at its ends."""
    np.testing.assert_array_equal(plot.wall_time(RECORDS),
                                  [[0, 0], [10, 12], [20, 14], [30, 19], [40, 21]])
    figure = plot.curves_figure([("run", RECORDS)])
    panels = figure.axes[:3]
    assert [ax.child_axes[0].get_xlabel() for ax in panels] == ["wall time (s)"] * 3
    for steps, seconds in (((20, 30), (14, 19)), ((10, 40), (12, 21)),
                           ((5, 45), (6, 22)),  # beyond the records: the end segments
                           ((0, 25), (0, 16.5))):
        for ax in panels:
            ax.set_xlim(*steps)
        figure.draw_without_rendering()  # a secondary axis follows its parent when drawn
        for ax in panels:
            assert ax.child_axes[0].get_xlim() == pytest.approx(seconds)


def test_a_clock_that_stands_still_keeps_only_its_first_step():
    """Two steps logged at the same second (an untimed stretch, or the rounding of 3
    decimals): the later one is left out, so that seconds map back to one step."""
    records = [{"step": 10, "loss": 1.0, "elapsed_s": 5.0},
               {"step": 20, "loss": 1.0, "elapsed_s": 5.0},
               {"step": 30, "loss": 1.0, "elapsed_s": 8.0}]
    np.testing.assert_array_equal(plot.wall_time(records), [[0, 0], [10, 5], [30, 8]])


def test_a_steps_clock_is_its_first_record_even_when_that_one_is_left_out():
    """Step 20's training record stands still (5 s, as step 10's): step 20 has no time, and
    its evaluation record, later in the step (7 s), does not stand in for it."""
    records = [{"step": 10, "loss": 1.0, "elapsed_s": 5.0},
               {"step": 20, "loss": 1.0, "elapsed_s": 5.0},
               {"step": 20, "eval_loss": 1.0, "elapsed_s": 7.0},
               {"step": 30, "loss": 1.0, "elapsed_s": 9.0}]
    np.testing.assert_array_equal(plot.wall_time(records), [[0, 0], [10, 5], [30, 9]])


def test_a_record_at_step_0_is_not_a_second_time_for_step_0():
    """The clock starts at (0, 0); a record of step 0 taken 3 s in would map step 0 to two
    times, so it is left out."""
    records = [{"step": 0, "loss": 5.0, "elapsed_s": 3.0},
               {"step": 10, "loss": 4.0, "elapsed_s": 8.0}]
    np.testing.assert_array_equal(plot.wall_time(records), [[0, 0], [10, 8]])
    figure = plot.curves_figure([("run", records)])
    assert figure.get_suptitle() == "run: 10 steps, 8 s"
    assert plot.curves_figure([("run", records[:1])]).get_suptitle() == "run: 0 steps, 3 s"


def test_wall_time_labels_do_not_crowd_where_the_clock_runs_unevenly():
    """A run whose first 1,000 steps took a minute (compiling) and the next 5,000 ninety
    seconds: evenly spaced minutes would put four labels over the first sixth of the axis.
    The labels kept are round times at least an eighth of the axis apart, left to right."""
    records = [{"step": step, "loss": 1.0,
                "elapsed_s": 60.0 * step / 1000 if step <= 1000 else 60 + 0.018 * (step - 1000)}
               for step in range(100, 6001, 100)]
    figure = plot.curves_figure([("run", records)])
    ax = figure.axes[0]
    ax.set_xlim(0, 6000)
    figure.draw_without_rendering()
    top = ax.child_axes[0]
    minutes = np.asarray(top.get_xticks())
    steps = np.interp(minutes * 60, plot.wall_time(records)[:, 1], plot.wall_time(records)[:, 0])
    assert len(minutes) >= 4 and np.all(np.diff(steps) >= 6000 / 8 - 1e-6), (minutes, steps)
    assert all(round(m / 0.25, 9).is_integer() for m in minutes)  # 0, 0.25, 0.5, ... minutes
    assert 0 <= steps.min() and steps.max() <= 6000
    labels = [t.get_text() for t in top.get_xticklabels()]
    assert len(labels) == len(minutes)


def test_wall_time_labels_of_an_even_clock_are_all_kept_when_an_eighth_apart():
    """A clock of 0.1 s a step over 770 steps: labels every 10 s are 100 steps apart, more
    than an eighth of the axis (96.25 steps), so none of 0, 10, ..., 70 s is dropped."""
    records = [{"step": s, "loss": 1.0, "elapsed_s": s / 10} for s in range(10, 771, 10)]
    figure = plot.curves_figure([("run", records)])
    ax = figure.axes[0]
    ax.set_xlim(0, 770)
    figure.draw_without_rendering()
    assert ax.child_axes[0].get_xlim() == pytest.approx((0, 77))
    np.testing.assert_allclose(ax.child_axes[0].get_xticks(), [0, 10, 20, 30, 40, 50, 60, 70])


def test_a_long_run_reads_its_clock_in_minutes():
    records = [{**r, "elapsed_s": 60 * r["elapsed_s"]} for r in RECORDS]
    figure = plot.curves_figure([("run", records)])
    ax = figure.axes[0]
    ax.set_xlim(20, 30)
    figure.draw_without_rendering()
    assert ax.child_axes[0].get_xlabel() == "wall time (min)"
    assert ax.child_axes[0].get_xlim() == pytest.approx((14, 19))
    assert figure.get_suptitle() == "run: 40 steps, 24 min"


def test_durations_read_in_seconds_then_minutes_then_hours():
    """Under 2 minutes in seconds, under 2 hours in minutes (a 90-minute run is 90 min,
    not 1.5 h), then hours."""
    assert [plot._duration(s) for s in (119.0, 120.0, 5400.0, 7199.0, 7200.0)] == [
        "119 s", "2 min", "90 min", "120 min", "2 h"]


def test_records_without_times_draw_no_time_axis():
    untimed = [{k: v for k, v in r.items() if k != "elapsed_s"} for r in RECORDS]
    assert plot.wall_time(untimed).shape == (0, 2)
    figure = plot.curves_figure([("run", untimed)])
    assert all(not ax.child_axes for ax in figure.axes)
    assert figure.get_suptitle() == "run: 40 steps"


def test_panels_only_for_what_was_logged(tmp_path):
    figure = plot.curves_figure([("run", NO_BLEU)])
    assert [ax.get_title() for ax in figure.axes if ax.get_title()] == ["Loss", "Learning rate"]
    plot.write_curves(str(tmp_path / "curves.png"), [("run", NO_BLEU)])
    assert png_size(tmp_path / "curves.png") == (2 * 500, 420)
    with pytest.raises(plot.MetricsError, match="no loss, BLEU, chrF or learning rate"):
        plot.curves_figure([("run", [{"step": 1, "eval_accuracy": 0.5}])])


def test_the_png_is_whole_and_of_the_figures_size(tmp_path):
    """Three panels of 5 x 4.2 inches at 100 dpi; written under a temporary name, then
    renamed: nothing else is left in the folder."""
    import matplotlib.image

    path = tmp_path / "curves.png"
    plot.write_curves(str(path), [("run", RECORDS)])
    assert png_size(path) == (1500, 420)
    assert matplotlib.image.imread(path).shape == (420, 1500, 4)
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]


def test_several_runs_one_line_per_run_per_panel():
    halved = [{k: v / 2 if k == "loss" else v for k, v in r.items()} for r in NO_BLEU]
    figure = plot.curves_figure([("base", RECORDS), ("halved", halved)])
    loss, quality, rate = figure.axes[:3]
    assert sorted(lines_by_gid(loss)) == ["base:eval_loss", "base:loss",
                                          "halved:eval_loss", "halved:loss"]
    assert sorted(lines_by_gid(quality)) == ["base:eval_bleu", "base:eval_chrf"]
    assert sorted(lines_by_gid(rate)) == ["base:learning_rate", "halved:learning_rate"]
    np.testing.assert_array_equal(lines_by_gid(loss)["halved:loss"],
                                  [[10, 2.0], [20, 1.0], [30, 0.5], [40, 0.25]])
    colours = {line.get_gid(): line.get_color() for ax in figure.axes for line in ax.get_lines()}
    assert {gid.split(":")[0]: c for gid, c in colours.items()} == {"base": "C0", "halved": "C1"}
    assert all(not ax.child_axes for ax in figure.axes)  # one clock per run: in the legend
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["base (40 steps, 24 s)",
                                                          "halved (40 steps, 22 s)"]


def test_several_runs_legend_the_line_styles_of_panels_with_two_series_only():
    """The runs' colours are in the figure's legend; a panel's own legend tells its series
    apart by line style, which a panel of one series (the learning rate) has no need of."""
    figure = plot.curves_figure([("base", RECORDS), ("other", RECORDS)])
    loss, quality, rate = figure.axes[:3]
    assert [t.get_text() for t in loss.get_legend().get_texts()] == [
        "training: to the smoothed labels, floor 0", "validation: cross-entropy"]
    assert [t.get_text() for t in quality.get_legend().get_texts()] == ["BLEU", "chrF"]
    assert rate.get_legend() is None


@pytest.mark.parametrize("runs, rows", [(4, 1), (5, 2)])
def test_the_runs_legend_has_at_most_four_columns(runs, rows):
    records = RECORDS[:2]
    figure = plot.curves_figure([(f"r{i}", records) for i in range(runs)])
    figure.canvas.draw()
    (legend,) = figure.legends
    assert len({round(t.get_window_extent().y0) for t in legend.get_texts()}) == rows


def test_run_names_are_folder_names_unless_two_are_the_same():
    assert plot.run_names(["runs/base", "other/big/"]) == ["base", "big"]
    assert plot.run_names(["a/run", "b/run"]) == ["a/run", "b/run"]
    assert plot.run_names(["a/run/", "b/./run"]) == ["a/run", "b/run"]


def test_a_run_given_as_dot_is_named_by_its_folder(tmp_path, monkeypatch):
    (tmp_path / "base").mkdir()
    monkeypatch.chdir(tmp_path / "base")
    assert plot.run_names([".", "../big"]) == ["base", "big"]


def test_only_numbers_are_drawn_ints_too_but_not_booleans():
    """JSON's 3 is a Python int and drawn; its true is a Python bool (an int) and is not,
    nor is a null."""
    records = [{"step": 1, "loss": 3}, {"step": 2, "loss": True},
               {"step": 3, "loss": 2.5}, {"step": 4, "loss": None}]
    np.testing.assert_array_equal(plot.series(records, "loss"), [[1, 3.0], [3, 2.5]])


def test_a_workdir_or_metrics_jsonl_of_the_wrong_kind_is_one_error(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(plot.MetricsError) as error:
        plot.load_run(str(tmp_path / "a_file"))
    assert str(error.value) == f"{tmp_path / 'a_file'} is a file, not a training run's folder"
    (tmp_path / "run" / "metrics.jsonl").mkdir(parents=True)
    with pytest.raises(plot.MetricsError) as error:
        plot.load_run(str(tmp_path / "run"))
    assert str(error.value) == f"{tmp_path / 'run' / 'metrics.jsonl'} is a folder, not a file"
    (tmp_path / "latin1").mkdir()
    (tmp_path / "latin1" / "metrics.jsonl").write_bytes(b'{"step": 1, "note": "caf\xe9"}\n')
    with pytest.raises(plot.MetricsError) as error:
        plot.load_run(str(tmp_path / "latin1"))
    assert str(error.value).startswith(f"{tmp_path / 'latin1' / 'metrics.jsonl'}: cannot read "
                                       f"it ('utf-8' codec can't decode")


def test_a_half_written_last_line_is_skipped_with_a_warning(tmp_path, capsys):
    path = write_run(tmp_path, RECORDS[:2], tail='{"step": 30, "lo') / "metrics.jsonl"
    assert plot.read_records(str(path)) == RECORDS[:2]
    assert capsys.readouterr().err == f"warning: {path}: skipped its half-written last line\n"
    path.write_text('{"step": 1\n' + json.dumps(RECORDS[0]) + "\n")
    with pytest.raises(plot.MetricsError, match=r"line 1: not a JSON record"):
        plot.read_records(str(path))
    path.write_text("hello world\n")  # a whole line (it ends), so not half-written
    with pytest.raises(plot.MetricsError, match=r"line 1: not a JSON record"):
        plot.read_records(str(path))
    path.write_text('{"step": 50.0, "loss": 1.0}\n')
    with pytest.raises(plot.MetricsError) as error:
        plot.read_records(str(path))
    assert str(error.value) == f"{path}, line 1: its step is not an integer (50.0)"
    path.write_text('\n{"step": true, "loss": 1.0}\n')  # JSON's true is Python's True, an int
    with pytest.raises(plot.MetricsError) as error:
        plot.read_records(str(path))
    assert str(error.value) == f"{path}, line 2: its step is not an integer (True)"
    for record in ('{"loss": 1.0}', "[1, 2]"):
        path.write_text(json.dumps(RECORDS[0]) + "\n  \n" + record + "\n")
        with pytest.raises(plot.MetricsError) as error:
            plot.read_records(str(path))
        assert str(error.value) == f"{path}, line 3: a record without a step"
    path.write_text("\n" + json.dumps(RECORDS[0]) + "\n\n")  # blank lines are no records
    assert plot.read_records(str(path)) == RECORDS[:1]


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "transformer_jax.plot", *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_command_line_draws_one_run_into_its_workdir_and_several_here(tmp_path):
    one = write_run(tmp_path / "runs" / "one", RECORDS, tail='{"step": 50')
    two = write_run(tmp_path / "runs" / "two", NO_BLEU)
    done = run_cli(one, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"wrote {one / 'curves.png'}\n"
    assert done.stderr == f"warning: {one / 'metrics.jsonl'}: skipped its half-written last line\n"
    assert png_size(one / "curves.png") == (1500, 420)
    done = run_cli("runs/one", "runs/two", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert png_size(tmp_path / "curves.png") == (1500, 420)
    assert not (two / "curves.png").exists()
    write_run(tmp_path / "runs" / "three", [{"step": 1, "eval_accuracy": 0.5}])
    done = run_cli("runs/one", "runs/three", "--output=two.png", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == ("warning: three has no loss, BLEU, chrF or "
                                            "learning rate to draw")
    assert png_size(tmp_path / "two.png") == (1500, 420)  # the first run's panels


def test_output_makes_its_folder_and_must_name_a_png(tmp_path):
    """As the benchmark's --plot: a missing folder is made; a name that is not .png is
    refused (argparse's usage error) before anything is drawn."""
    run = write_run(tmp_path / "run", RECORDS)
    done = run_cli(run, f"--output={tmp_path / 'plots' / 'new' / 'c.png'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert png_size(tmp_path / "plots" / "new" / "c.png") == (1500, 420)
    done = run_cli(run, "--output=c.txt", cwd=tmp_path)
    assert done.returncode == 2 and not (tmp_path / "c.txt").exists()
    assert done.stderr.splitlines()[-1].endswith("error: --output needs a .png file name, got "
                                                 "'c.txt'")


@pytest.mark.parametrize("case", ["no metrics.jsonl", "no folder", "empty", "unwritable"])
def test_command_line_errors_are_one_line(tmp_path, case):
    run = tmp_path / "run"
    run.mkdir()
    args = [run]
    if case == "no folder":
        args = [tmp_path / "missing"]
    elif case == "empty":
        (run / "metrics.jsonl").write_text("")
    elif case == "unwritable":  # /proc refuses new entries, even to root
        write_run(run, RECORDS)
        args.append("--output=/proc/curves.png")
    expected = {"no metrics.jsonl": f"error: {run} holds no metrics.jsonl (is it a training "
                                    f"run's --workdir?)",
                "no folder": f"error: {tmp_path / 'missing'}: no such folder",
                "empty": f"error: {run / 'metrics.jsonl'} holds no records yet",
                "unwritable": "error: --output's folder /proc is not a writable folder: "}[case]
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(expected), done.stderr


def test_a_step_logged_again_draws_its_last_value_in_step_order():
    """A file holding steps 10..30 and then, from a resume, 20..40 again: one line in step
    order through the later values, not a zigzag back to step 20."""
    resumed = [{"step": s, "loss": v} for s, v in ((10, 4.0), (20, 3.0), (30, 2.5),
                                                   (20, 2.0), (30, 1.5), (40, 1.0))]
    np.testing.assert_array_equal(plot.series(resumed, "loss"),
                                  [[10, 4.0], [20, 2.0], [30, 1.5], [40, 1.0]])


def test_a_series_of_one_point_is_drawn_as_a_marker():
    """One logged step: no segment to draw, so a marker shows it; longer series keep none."""
    figure = plot.curves_figure([("run", [{"step": 50, "loss": 4.2, "learning_rate": 2e-4}])])
    assert [line.get_marker() for ax in figure.axes for line in ax.get_lines()] == ["o", "o"]
    assert figure.get_suptitle() == "run: 50 steps"
    figure = plot.curves_figure([("run", NO_BLEU)])
    markers = {line.get_gid(): line.get_marker() for line in figure.axes[0].get_lines()}
    assert markers == {"run:loss": "", "run:eval_loss": "o"}  # validation: its own marker
    single = plot.curves_figure([("run", [{"step": 1, "loss": 4.0}])])
    assert single.get_suptitle() == "run: 1 step"
    two = plot.curves_figure([("run", [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0}])])
    assert two.axes[0].get_lines()[0].get_marker() == ""


def test_the_step_axis_starts_at_0():
    figure = plot.curves_figure([("run", RECORDS)])
    assert [ax.get_xlim()[0] for ax in figure.axes[:3]] == [0, 0, 0]


@pytest.mark.parametrize("bleu, limits", [(20.0, (-0.66, 22.0)),  # 10% above the best
                                          (99.0, (-3.12, 104.0)),  # at most 104
                                          (0.0, (-3.0, 100.0))])  # all 0: the whole scale
def test_the_bleu_axis_reaches_a_little_above_the_best_score(bleu, limits):
    """From just below 0 (room for the markers of a 0) to 10% above the best score (here
    BLEU, above chrF), but no higher than 104; all 0, up to 100."""
    records = [{"step": 10, "eval_bleu": bleu / 2, "eval_chrf": bleu / 4},
               {"step": 20, "eval_bleu": bleu, "eval_chrf": bleu / 2}]
    (quality,) = plot.curves_figure([("run", records)]).axes
    assert quality.get_ylim() == pytest.approx(limits)


def test_learning_rate_ticks_are_labelled_with_their_exact_values():
    """1.25e-04, not 1.2e-04: one digit would name two ticks alike or wrongly."""
    figure = plot.curves_figure([("run", RECORDS)])
    rate = figure.axes[2]
    figure.canvas.draw()
    low, high = rate.get_ylim()
    shown = {v: t.get_text() for t, v in zip(rate.get_yticklabels(), rate.get_yticks())
             if low <= v <= high}
    assert shown[0] == "0" and len(shown) > 3
    for value, text in shown.items():
        assert float(text) == pytest.approx(value, rel=1e-12), (value, text)


@pytest.mark.parametrize("case", ["twice", "eleven", "empty output", "fifo"])
def test_runs_and_output_the_figure_cannot_show_are_refused(tmp_path, case):
    """The same run under two names, more runs than colours, an empty --output (an unset
    variable, which would mean the run's own curves.png) and a FIFO as metrics.jsonl (which
    would wait for a writer) are each one line."""
    run = write_run(tmp_path / "run", RECORDS)
    args, code, message = {
        "twice": ([run, f"{run}/"], 2, f"error: {run} is given twice (two names of one "
                                       f"folder); give each run once"),
        "eleven": ([write_run(tmp_path / f"r{i}", RECORDS) for i in range(11)], 2,
                   "error: 11 runs: at most 10 fit one figure, one colour each"),
        "empty output": ([run, "--output="], 2, "error: --output needs a .png file name, "
                                                "got ''"),
        "fifo": ([tmp_path / "fifo_run"], 1, f"error: {tmp_path / 'fifo_run' / 'metrics.jsonl'}"
                                             f" is not a regular file"),
    }[case]
    if case == "fifo":
        (tmp_path / "fifo_run").mkdir()
        os.mkfifo(tmp_path / "fifo_run" / "metrics.jsonl")
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == code
    assert done.stderr.splitlines()[-1].endswith(message), done.stderr
    assert not list(tmp_path.glob("**/*.png"))


def test_an_output_that_is_a_link_writes_its_target(tmp_path):
    """As translate.py's --output: the link stays, and the picture is written where it
    points."""
    run = write_run(tmp_path / "run", RECORDS)
    (tmp_path / "pictures").mkdir()
    (tmp_path / "link.png").symlink_to(tmp_path / "pictures" / "curves.png")
    done = run_cli(run, "--output=link.png", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "link.png").is_symlink()
    assert png_size(tmp_path / "pictures" / "curves.png") == (1500, 420)
    assert done.stdout == "wrote link.png\n"  # the name given


def test_ten_runs_fit_one_figure_and_an_upper_case_png_is_a_png(tmp_path, capsys):
    runs = [str(write_run(tmp_path / f"r{i}", RECORDS[:2])) for i in range(10)]
    output = tmp_path / "TEN.PNG"
    assert plot.main([*runs, f"--output={output}"]) == 0
    assert capsys.readouterr().out == f"wrote {output}\n"
    assert png_size(output) == (1000, 420)  # two panels: loss and learning rate


def test_a_png_that_cannot_be_written_is_one_error_naming_why(tmp_path, capsys, monkeypatch):
    """A disk that fills while the PNG is written (not /dev/full itself: a regression that
    replaced the file it writes would leave a regular file there for every later run)."""
    def full_disk(figure, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    run = write_run(tmp_path / "run", RECORDS[:2])
    monkeypatch.setattr(plot, "save_png", full_disk)
    assert plot.main([str(run), f"--output={tmp_path / 'full.png'}"]) == 1
    assert capsys.readouterr().err == (f"error: cannot write {tmp_path / 'full.png'}: "
                                       f"No space left on device\n")


def test_writable_file_is_the_real_path_its_folder_made(tmp_path):
    """A link is resolved (and the folder its target is in is made), so that the file is
    written where the link points."""
    (tmp_path / "link.png").symlink_to(tmp_path / "pictures" / "new" / "curves.png")
    assert (writable_file(str(tmp_path / "link.png"), "--output")
            == str(tmp_path / "pictures" / "new" / "curves.png"))
    assert (tmp_path / "pictures" / "new").is_dir()
    assert not (tmp_path / "pictures" / "new" / "curves.png").exists()


def test_writable_file_and_folder_errors_name_the_flag_and_why(tmp_path):
    (tmp_path / "folder.png").mkdir()
    cases = [
        (writable_file, str(tmp_path / "folder.png"),
         f"--output={tmp_path / 'folder.png'} is a folder; give a file name"),
        (writable_file, "", "--output is empty (an unset shell variable?); name a file"),
        (writable_folder, "", "--workdir is empty (an unset shell variable?); name a folder"),
        (writable_file, "/proc/curves.png", "--output's folder /proc is not a writable folder: "
                                            "a file cannot be made there (No such file or "
                                            "directory)"),
        (writable_file, "/proc/x/curves.png", "--output's folder /proc/x is not a writable "
                                              "folder: No such file or directory"),
    ]
    for function, path, message in cases:
        with pytest.raises(OutputPathError) as error:
            function(path, "--output") if function is writable_file else function(path)
        assert str(error.value) == message


def test_a_png_to_a_pipe_is_written_to_it_and_the_pipe_stays(tmp_path):
    """`--output=/dev/stdout` (or a named pipe, or the benchmark's --plot): the PNG goes
    straight into it; a temporary file renamed over the path replaced the pipe with a
    regular file, and its reader got nothing."""
    import stat
    import threading

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    figure = plt.figure(figsize=(2, 1))
    plot.save_png(figure, str(fifo), dpi=50)
    plt.close(figure)
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert len(got) == 1 and got[0][:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", got[0][16:24])  # the IHDR chunk: 2 x 1 inches
    assert (width, height) == (100, 50)
