"""Benchmark results as a terminal table and as JSON, the JSON written row by row as the
suite measures them (`streaming`, `measured`)."""

import contextlib
import datetime
import json
import os

from transformer_jax.benchmark import machine
from transformer_jax.commands import write_whole


def format_value(value) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value).lower()
    if isinstance(value, float):
        if abs(value) >= 999.5:  # what rounds to 1,000, which "{:.3g}" writes as 1e+03
            return f"{value:,.0f}"
        return f"{value:.3g}" if value == 0 or abs(value) >= 0.01 else f"{value:.2e}"
    if isinstance(value, int) and abs(value) >= 10_000:  # memory_bytes: 259,041,992
        return f"{value:,}"
    return str(value)


def _cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Every key that any row has, in first-seen order, and the formatted values."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return columns, [[format_value(row.get(key)) for key in columns] for row in rows]


def _groups(rows: list[dict]) -> list[list[dict]]:
    """The rows in groups, one table each, in the order of their first rows: a row joins
    the latest group with which it shares half of their columns or more, else starts one
    (the pipeline suite's preparation after its reading rates; the compare suite's
    torch.compile row, timed after the attention rows, beside the train steps), so that no
    table is mostly blanks."""
    groups = []
    for row in rows:
        for group in reversed(groups):
            columns = set().union(*group)
            if 2 * len(columns & row.keys()) >= len(columns | row.keys()):
                group.append(row)
                break
        else:
            groups.append([row])
    return groups


def markdown(rows: list[dict]) -> str:
    """The rows as Markdown tables (for BENCHMARKS.md), one per group of rows that share
    their columns (`_groups`)."""
    return "\n\n".join(map(_markdown, _groups(rows)))


def _markdown(rows: list[dict]) -> str:
    columns, cells = _cells(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(line) + " |" for line in cells])


def table(rows: list[dict]) -> str:
    """Aligned columns for the terminal, a table per group of rows that share their
    columns (`_groups`)."""
    return "\n\n".join(map(_table, _groups(rows))) if rows else "(no results)"


def _table(rows: list[dict]) -> str:
    columns, cells = _cells(rows)
    widths = [max(len(key), *(len(line[i]) for line in cells)) for i, key in enumerate(columns)]
    lines = ["  ".join(key.rjust(w) for key, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def document(suite: str, rows: list[dict], *, quick: bool, notes: list[str],
             argv: list[str] | None = None, complete: bool = True) -> dict:
    """The JSON report: the command's arguments (`argv`), the machine and software, then
    every figure; `complete` false while the suite runs (`streaming`)."""
    return {
        "suite": suite,
        "quick": quick,
        "complete": complete,
        "argv": argv,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine.describe(),
        "notes": notes,
        "results": rows,
    }


def write_json(path: str, report: dict) -> None:
    """The report as JSON at `path`, whole or not at all (`commands.write_whole`: a path
    that is not a regular file, /dev/stdout or a pipe, is written straight to)."""
    write_whole({path: json.dumps(report, indent=2) + "\n"})


_stream: tuple[str, dict] | None = None  # (--json's path, its document) inside `streaming`


@contextlib.contextmanager
def streaming(path: str | None, suite: str, *, quick: bool, argv: list[str]):
    """Inside, each row a suite hands to `measured` rewrites `path` (when not None) with every
    row so far, `"complete": false` and no notes (they come at the end): a run stopped part
    way (a timeout's SIGTERM, Ctrl-C, a case that fails) keeps what it measured. Yields the
    list of those rows; the caller writes the whole document when the suite returns."""
    global _stream
    partial = document(suite, [], quick=quick, notes=[], argv=argv, complete=False)
    # A stream (/dev/stdout, a pipe) takes the whole document once: rows written as they
    # come would be read as several documents.
    rewritable = path is not None and (os.path.isfile(path) or not os.path.exists(path))
    outer, _stream = _stream, (path, partial) if rewritable else None
    try:
        yield partial["results"]
    finally:
        _stream = outer


def measured(row: dict) -> dict:
    """`row` as it is, once a suite has measured it; inside `streaming`, written out with
    the rows before it. A suite may add to a row later (a ratio to the next row): the next
    row written shows it."""
    if _stream is not None:
        path, partial = _stream
        write_json(path, {**partial, "results": [*partial["results"], row]})
        partial["results"].append(row)  # once written: the rows the file holds
    return row
