"""Pictures of benchmark results (matplotlib, from the `bench` extra)."""

import itertools


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plots need matplotlib: pip install 'transformer_jax[bench]'") from None
    return plt


def attention_figure(rows: list[dict]):
    """TFLOP/s against sequence length, one line per implementation (and head dim, causal),
    one panel per dtype and pass, the device's peak as a dashed line."""
    plt = _pyplot()
    panels = sorted({(r["dtype"], r["pass"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (dtype, pass_) in zip(axes[0], panels):
        chosen = [r for r in rows if (r["dtype"], r["pass"]) == (dtype, pass_)]
        key = lambda r: (r["implementation"], r["head_dim"], r["causal"])  # noqa: E731
        for (name, head_dim, causal), group in itertools.groupby(sorted(chosen, key=key), key):
            group = sorted(group, key=lambda r: r["seq_len"])
            label = f"{name} H={head_dim}" + (" causal" if causal else "")
            ax.plot([r["seq_len"] for r in group], [r["tflops"] for r in group], "o-",
                    label=label)
        peak = chosen[0].get("peak_tflops")
        if peak:
            ax.axhline(peak, color="k", linestyle="--", label=f"peak {peak:.3g}")
        lengths = sorted({r["seq_len"] for r in chosen})
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, labels=[str(n) for n in lengths])
        ax.minorticks_off()
        ax.set(xlabel="sequence length", ylabel="TFLOP/s", title=f"attention {pass_}, {dtype}")
        ax.legend(fontsize=7)
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
            "pipeline": "examples_per_sec", "compare": "tokens_per_sec"}


def save(suite: str, rows: list[dict], path: str) -> None:
    if suite == "attention":
        fig = attention_figure(rows)
    else:
        fig = bar_figure(rows, HEADLINE[suite], f"{suite} benchmark")
    fig.savefig(path, dpi=120)
