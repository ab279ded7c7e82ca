"""Summaries of simulation results: the comparison table, JSON, and figures.

Per strategy: total cost, savings against the first strategy (the on-demand baseline), deadline
misses among jobs with a deadline, mean and p95 completion time (arrival to finish), GPU-hours lost
to interruptions (compute thrown away), interruptions, and jobs that did not finish.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuscaler.simulator.engine import SimulationResult


@dataclass(frozen=True)
class StrategySummary:
    """One row of the comparison."""

    strategy: str
    label: str
    jobs: int
    finished: int
    unplanned: int
    abandoned: int
    cost_usd: float
    deadline_jobs: int
    deadline_misses: int
    over_budget: int
    mean_completion_h: float
    p95_completion_h: float
    gpu_hours: float
    gpu_hours_lost: float
    interruptions: int
    shortages: int

    @property
    def miss_rate(self) -> float:
        return self.deadline_misses / self.deadline_jobs if self.deadline_jobs else 0.0

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = asdict(self)
        d["miss_rate"] = self.miss_rate
        return d


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation; nan for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(result: SimulationResult) -> StrategySummary:
    """The summary row of one strategy's run."""
    outs = result.outcomes
    done = [o.completion_h for o in outs if o.completion_h is not None]
    with_deadline = [o for o in outs if o.deadline_h is not None]
    return StrategySummary(
        strategy=result.strategy,
        label=result.label,
        jobs=len(outs),
        finished=len(done),
        unplanned=sum(o.status == "unplanned" for o in outs),
        abandoned=sum(o.status == "abandoned" for o in outs),
        cost_usd=sum(o.cost_usd for o in outs),
        deadline_jobs=len(with_deadline),
        deadline_misses=sum(o.missed_deadline for o in with_deadline),
        over_budget=sum(o.over_budget for o in outs),
        mean_completion_h=sum(done) / len(done) if done else math.nan,
        p95_completion_h=percentile(done, 0.95),
        gpu_hours=sum(o.gpu_hours for o in outs),
        gpu_hours_lost=sum(o.gpu_hours_lost for o in outs),
        interruptions=sum(o.interruptions for o in outs),
        shortages=sum(o.shortages for o in outs),
    )


def _money(x: float) -> str:
    return f"${x:,.0f}"


def _cells(rows: Sequence[StrategySummary]) -> tuple[list[str], list[list[str]]]:
    base = rows[0].cost_usd if rows else 0.0
    headers = ["strategy", "cost", "vs first", "deadline misses", "over budget", "mean h", "p95 h",
               "GPU-h", "GPU-h lost", "interruptions", "unfinished"]
    body = []
    for r in rows:
        saving = f"{(r.cost_usd - base) / base:+.0%}" if base > 0 else "-"
        misses = f"{r.deadline_misses}/{r.deadline_jobs}" if r.deadline_jobs else "-"
        body.append([
            r.strategy, _money(r.cost_usd), saving, misses, str(r.over_budget),
            f"{r.mean_completion_h:.1f}", f"{r.p95_completion_h:.1f}", f"{r.gpu_hours:,.0f}",
            f"{r.gpu_hours_lost:,.1f}", str(r.interruptions), str(r.unplanned + r.abandoned),
        ])
    return headers, body


def format_table(rows: Sequence[StrategySummary]) -> str:
    """A plain-text table, one strategy per line; savings relative to the first row."""
    headers, body = _cells(rows)
    cells = [headers, *body]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def format_markdown(rows: Sequence[StrategySummary]) -> str:
    """The same table as GitHub Markdown."""
    headers, body = _cells(rows)
    out = ["| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    out += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(out)


def plot(results: Sequence[SimulationResult], directory: str | Path, title: str = "") -> list[Path]:
    """Write ``cost_vs_misses.png`` and ``completion_cdf.png`` into ``directory`` (matplotlib, Agg).

    Raises:
        ImportError: matplotlib is not installed (``pip install gpuscaler[plot]``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [summarize(r) for r in results]
    paths = []

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for k, r in enumerate(rows):
        ax.scatter(r.miss_rate * 100, r.cost_usd, s=60)
        ax.annotate(r.strategy, (r.miss_rate * 100, r.cost_usd), textcoords="offset points",
                    xytext=(6, 4 if k % 2 == 0 else -12), fontsize=8)
    ax.set_xlabel("deadline-miss rate (% of jobs with a deadline)")
    ax.set_ylabel("total cost (USD)")
    ax.set_title(f"Cost vs deadline misses{': ' + title if title else ''}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    p = out_dir / "cost_vs_misses.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for res in results:
        done = sorted(o.completion_h for o in res.outcomes if o.completion_h is not None)
        if not done:
            continue
        n = len(res.outcomes)
        ax.step(done, [(k + 1) / n for k in range(len(done))], where="post", label=res.strategy)
    ax.set_xscale("log")
    ax.set_xlabel("completion time, arrival to finish (hours, log scale)")
    ax.set_ylabel("share of jobs finished")
    ax.set_title(f"Completion time CDF{': ' + title if title else ''}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / "completion_cdf.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    return paths
