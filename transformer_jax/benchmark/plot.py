"""Pictures of benchmark results (matplotlib, from the `bench` extra)."""

import itertools
import textwrap

from transformer_jax.plot import save_png


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plots need matplotlib: pip install 'transformer_jax[bench]'") from None
    return plt


def attention_figure(rows: list[dict]):
    """TFLOP/s against sequence length: one panel per dtype and pass (columns) and masking
    (rows), one colour per implementation, solid for head dim 64 and dashed for others;
    the device's peak as a dotted black line. The grid's rows only: not those at a model's
    shape (the masks of training)."""
    plt = _pyplot()
    rows = [r for r in rows if "model" not in r]
    columns = sorted({(r["dtype"], r["pass"]) for r in rows})
    masks = sorted({r["causal"] for r in rows})
    names = sorted({r["implementation"] for r in rows})
    colors = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    head_dims = sorted({r["head_dim"] for r in rows})
    fig, axes = plt.subplots(len(masks), len(columns), squeeze=False, sharex=True,
                             figsize=(4.2 * len(columns), 3.4 * len(masks)))
    for (i, causal), (j, (dtype, pass_)) in itertools.product(enumerate(masks),
                                                              enumerate(columns)):
        ax = axes[i][j]
        chosen = [r for r in rows if (r["dtype"], r["pass"], r["causal"]) == (dtype, pass_, causal)]
        for name, head_dim in itertools.product(names, head_dims):
            line = sorted((r for r in chosen if (r["implementation"], r["head_dim"])
                           == (name, head_dim)), key=lambda r: r["seq_len"])
            ax.plot([r["seq_len"] for r in line], [r["tflops"] for r in line], marker="o",
                    color=colors[name], linestyle="-" if head_dim == head_dims[0] else "--",
                    label=f"{name} H={head_dim}")
        peak = chosen[0].get("peak_tflops") if chosen else None
        if peak:
            ax.axhline(peak, color="k", linestyle=":", label=f"peak {peak:.3g} TFLOP/s")
        lengths = sorted({r["seq_len"] for r in chosen})
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, labels=[str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set(xlabel="sequence length", ylabel="TFLOP/s",
               title=f"{pass_}, {dtype}" + (", causal" if causal else ""))
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def bar_figure(rows: list[dict], value: str, title: str):
    """One horizontal bar per row: its `value`, labelled by the settings that differ among
    the rows (`row_labels`); the settings they share go into the title."""
    plt = _pyplot()
    chosen = [r for r in rows if r.get(value)]
    labels, shared = row_labels(chosen)
    longest = max(map(len, labels), default=0)  # wider for long labels, not narrower bars
    fig, ax = plt.subplots(figsize=(max(8.0, 5 + 0.09 * longest), 0.35 * len(chosen) + 1.6))
    values = [r[value] for r in chosen]
    ax.barh(labels, values)
    log = max(values) > 100 * min(values)  # grain's packers beside ours: 500 x apart
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(value.replace("tflops", "TFLOP/s").replace("_per_sec", "/s").replace("_", " ")
                  + (" (log scale)" if log else ""))
    fig.suptitle(title, fontsize=11)  # over the figure: long labels narrow the axes
    ax.set_title("\n".join(textwrap.wrap(shared, 90)), fontsize=9)
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


# Int columns that a run measures rather than sets: how many calls were timed
# (`timing.Seconds.columns`) and how many tokens a search wrote (decode --peers).
MEASURED_INTS = ("timed", "tokens")


def row_labels(rows: list[dict]) -> tuple[list[str], str]:
    """(a label per row, the settings every row shares, as key=value). A row's settings are
    its text, bool and int fields but the ints that are measured (`MEASURED_INTS`, a byte
    count); in a label, a text value stands for itself, any other as key=value. Rows whose
    settings are all equal (a case timed again) are told apart by their order, #1, #2, ..."""
    def settings(row):
        return [(k, v) for k, v in row.items() if isinstance(v, (str, bool, int))
                and k not in MEASURED_INTS and not k.endswith("_bytes")]

    def shown(k, v):
        return v if isinstance(v, str) else f"{k}={v}"

    keys = dict.fromkeys(k for r in rows for k, _ in settings(r))
    varying = {k for k in keys if len({repr(r.get(k)) for r in rows}) > 1}
    labels = [" ".join(shown(k, v) for k, v in settings(r) if k in varying) or "all"
              for r in rows]
    for label in set(labels):
        if labels.count(label) > 1:
            at = [i for i, text in enumerate(labels) if text == label]
            for n, i in enumerate(at, start=1):
                labels[i] = f"{label} #{n}"
    shared = ", ".join(f"{k}={rows[0][k]}" for k in keys if k not in varying and k in rows[0])
    return labels, shared


# The value each suite's figure draws.
HEADLINE = {"attention": "tflops", "model": "tokens_per_sec", "decode": "tokens_per_sec",
            "pipeline": "examples_per_sec", "compare": "tflops", "loss": "tflops"}


def save(suite: str, rows: list[dict], path: str, where: str = "",
         name: str | None = None) -> None:
    """The suite's figure at `path` (a PNG), whole or not at all; `name` (the suite's when
    None: "decode --peers") and `where` (the device, say) go into its title."""
    title = f"{name or suite} benchmark" + (f" on {where}" if where else "")
    if suite == "attention":
        fig = attention_figure(rows)
        fig.suptitle(title)
        fig.tight_layout()
    else:
        fig = bar_figure(rows, HEADLINE[suite], title)
    save_png(fig, path, dpi=120)
