"""`presto-ray eval`'s plot: accuracy against the tokens each method spent per problem, and the
likelihood of its answers (matplotlib, imported when a plot is drawn; the Agg backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from presto_ray.evaluate import EvalReport


def plot_report(report: EvalReport, path: str) -> None:
    """Accuracy (pass@1: the mean over answers and seeds) against the tokens each method spent per
    problem and seed (one point per method, its 95% Wilson interval counted over problems; the
    legend gives the paired test's p-value against power where power ran), and the mean log p0
    per answer token (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    methods = report.methods
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    colors = plt.get_cmap("tab10")
    seen: list[float] = []
    for k, m in enumerate(methods):
        x, y = m["generated_tokens_per_problem"], m["accuracy"]
        twins = sum(abs(x - other) <= 0.01 * max(x, 1.0) for other in seen)  # same cost: dodge a little
        seen.append(x)
        err = [[max(0.0, y - m["ci_low"])], [max(0.0, m["ci_high"] - y)]]
        test = m.get("paired_vs_power")
        label = m["name"] + (f" (p = {test['p_value']:.2g} vs power)" if test else "")
        left.errorbar([x * 1.04**twins], [y], yerr=err, fmt="o", capsize=4, color=colors(k), label=label)
    if methods and min(m["generated_tokens_per_problem"] for m in methods) > 0:
        left.set_xscale("log")
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        left.xaxis.set_major_formatter(plain)
        left.xaxis.set_minor_formatter(plain)
        left.tick_params(axis="x", which="minor", labelsize=7)
    seeds = len(getattr(report, "seeds", None) or [None])
    left.set_xlabel("tokens generated per problem" + (" and seed" if seeds > 1 else "") + " (every candidate and proposal)")
    left.set_ylabel("pass@1" + (f", mean over {seeds} seeds" if seeds > 1 else "") + " (95% Wilson CI)")
    left.set_ylim(-0.02, 1.02)
    left.legend(fontsize=7, loc="upper left")
    left.set_title(f"{report.task}, {report.problems} problems" + (f" x {seeds} seeds" if seeds > 1 else ""))
    left.grid(alpha=0.3)
    names = [m["name"] for m in methods]
    right.bar(names, [m["mean_logp0_per_token"] for m in methods], color=[colors(k) for k in range(len(methods))])
    right.set_ylabel("mean log p0 per answer token")
    right.set_title("likelihood of the answers")
    right.tick_params(axis="x", rotation=25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
