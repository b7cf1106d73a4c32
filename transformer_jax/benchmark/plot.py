"""Pictures of benchmark results (matplotlib, from the `bench` extra)."""

import itertools

from transformer_jax.atomic_file import atomic_write


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
            ax.axhline(peak, color="k", linestyle=":", label=f"peak {peak:.3g}")
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
    """One horizontal bar per row: its `value`, labelled by the row's other text fields."""
    plt = _pyplot()
    chosen = [r for r in rows if r.get(value)]
    labels = [" ".join(str(v) for k, v in r.items() if isinstance(v, str)) for r in chosen]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(chosen) + 1.2))
    ax.barh(labels, [r[value] for r in chosen])
    ax.set(xlabel=value, title=title)
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


HEADLINE = {"model": "tokens_per_sec", "decode": "tokens_per_sec",
            "pipeline": "examples_per_sec", "compare": "tokens_per_sec", "loss": "tflops"}


def save(suite: str, rows: list[dict], path: str) -> None:
    """The suite's figure at `path` (a PNG), whole or not at all."""
    if suite == "attention":
        fig = attention_figure(rows)
    else:
        fig = bar_figure(rows, HEADLINE[suite], f"{suite} benchmark")
    with atomic_write(path, "wb") as f:
        fig.savefig(f, dpi=120, format="png")
