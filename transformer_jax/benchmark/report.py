"""Benchmark results as a terminal table and as JSON."""

import datetime
import json

from transformer_jax.atomic_file import atomic_write
from transformer_jax.benchmark import machine


def format_value(value) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value).lower()
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if value == 0 or abs(value) >= 0.01 else f"{value:.2e}"
    if isinstance(value, int) and abs(value) >= 10_000:  # memory_bytes: 259,041,992
        return f"{value:,}"
    return str(value)


def _cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Every key that any row has, in first-seen order, and the formatted values."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return columns, [[format_value(row.get(key)) for key in columns] for row in rows]


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table (for BENCHMARKS.md)."""
    columns, cells = _cells(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(line) + " |" for line in cells])


def table(rows: list[dict]) -> str:
    """Aligned columns for the terminal."""
    if not rows:
        return "(no results)"
    columns, cells = _cells(rows)
    widths = [max(len(key), *(len(line[i]) for line in cells)) for i, key in enumerate(columns)]
    lines = ["  ".join(key.rjust(w) for key, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def document(suite: str, rows: list[dict], *, quick: bool, notes: list[str],
             argv: list[str] | None = None) -> dict:
    """The JSON report: the command's arguments (`argv`), the machine and software, then
    every figure."""
    return {
        "suite": suite,
        "quick": quick,
        "argv": argv,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine.describe(),
        "notes": notes,
        "results": rows,
    }


def write_json(path: str, report: dict) -> None:
    """The report as JSON at `path`, whole or not at all (`atomic_write`)."""
    with atomic_write(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
