"""Summaries of simulation results: the comparison table, JSON, and figures.

Per strategy: total cost, savings against the first strategy, deadline misses among jobs with a
deadline, mean and p95 completion time (arrival to finish), GPU-hours lost to interruptions
(compute thrown away), interruptions, and jobs that did not finish. Over several seeds every
figure is shown as its range (lowest-highest), :class:`SeedRange`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
    moves: int = 0
    corrections: int = 0
    seed: int = 0

    @property
    def miss_rate(self) -> float:
        """Deadline misses as a share of the jobs with a deadline (0 without any)."""
        return self.deadline_misses / self.deadline_jobs if self.deadline_jobs else 0.0

    @property
    def unfinished(self) -> int:
        """Jobs the strategy could not plan or gave up on."""
        return self.unplanned + self.abandoned

    def to_dict(self) -> dict[str, object]:
        """The row as strict JSON values (no NaN: a figure that does not exist is null)."""
        d: dict[str, object] = {k: _finite(v) for k, v in asdict(self).items()}
        d["miss_rate"] = self.miss_rate
        return d


def _finite(v: object) -> object:
    return None if isinstance(v, float) and not math.isfinite(v) else v


RANGED = ("cost_usd", "deadline_misses", "over_budget", "mean_completion_h", "p95_completion_h", "gpu_hours",
          "gpu_hours_lost", "interruptions", "shortages", "moves", "corrections", "unfinished", "miss_rate")
"""The figures :class:`SeedRange` gives as ranges over seeds."""


@dataclass(frozen=True)
class SeedRange:
    """One strategy over several seeds: each figure's lowest and highest value (and mean)."""

    strategy: str
    label: str
    deadline_jobs: int
    jobs: int
    rows: tuple[StrategySummary, ...]

    def values(self, name: str) -> list[float]:
        """The figure ``name`` per seed (non-finite values left out)."""
        out = [float(getattr(r, name)) for r in self.rows]
        return [v for v in out if math.isfinite(v)]

    def low(self, name: str) -> float:
        """The lowest value of figure ``name`` over the seeds (nan when none has it)."""
        v = self.values(name)
        return min(v) if v else math.nan

    def high(self, name: str) -> float:
        """The highest value of figure ``name`` over the seeds (nan when none has it)."""
        v = self.values(name)
        return max(v) if v else math.nan

    def to_dict(self) -> dict[str, object]:
        """Strict JSON: every ranged figure as ``{min, max, mean}`` (null when no seed has it), the
        seeds' rows under ``per_seed``."""
        d: dict[str, object] = {"strategy": self.strategy, "label": self.label, "jobs": self.jobs,
                                "deadline_jobs": self.deadline_jobs, "seeds": [r.seed for r in self.rows]}
        for name in RANGED:
            v = self.values(name)
            d[name] = {"min": min(v), "max": max(v), "mean": sum(v) / len(v)} if v else None
        d["per_seed"] = [r.to_dict() for r in self.rows]
        return d


def ranges(runs: Sequence[Sequence[StrategySummary]]) -> list[SeedRange]:
    """Per strategy (in the order of the first run), its rows over the runs (one run per seed)."""
    if not runs:
        return []
    out = []
    for k, first in enumerate(runs[0]):
        rows = tuple(run[k] for run in runs)
        out.append(SeedRange(first.strategy, first.label, first.deadline_jobs, first.jobs, rows))
    return out


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
        moves=sum(o.moves for o in outs),
        corrections=sum(o.corrections for o in outs),
        seed=result.seed,
    )


def _span(lo: float, hi: float, fmt: str, prefix: str = "") -> str:
    """``lo-hi`` (one value when they agree as printed); ``-`` for no value."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    a, b = format(lo, fmt), format(hi, fmt)
    return prefix + a if a == b else f"{prefix}{a}-{b}"


def _cells(rows: Sequence[StrategySummary] | Sequence[SeedRange]) -> tuple[list[str], list[list[str]]]:
    ranged = [r if isinstance(r, SeedRange) else SeedRange(r.strategy, r.label, r.deadline_jobs, r.jobs, (r,))
              for r in rows]
    headers = ["strategy", "cost", "vs first", "deadline misses", "over budget", "mean h", "p95 h",
               "GPU-h", "GPU-h lost", "interruptions", "unfinished"]
    body = []
    base = ranged[0] if ranged else None
    for r in ranged:
        assert base is not None
        savings = [(row.cost_usd - b.cost_usd) / b.cost_usd for row, b in zip(r.rows, base.rows, strict=True)
                   if b.cost_usd > 0]
        saving = "-"
        if savings:
            lo, hi = f"{min(savings):+.0%}", f"{max(savings):+.0%}"
            saving = lo if lo == hi else f"{lo} to {hi}"
        misses = (_span(r.low("deadline_misses"), r.high("deadline_misses"), ".0f") + f"/{r.deadline_jobs}"
                  if r.deadline_jobs else "-")
        body.append([
            r.strategy,
            _span(r.low("cost_usd"), r.high("cost_usd"), ",.0f", "$"),
            saving,
            misses,
            _span(r.low("over_budget"), r.high("over_budget"), ".0f"),
            _span(r.low("mean_completion_h"), r.high("mean_completion_h"), ".1f"),
            _span(r.low("p95_completion_h"), r.high("p95_completion_h"), ".1f"),
            _span(r.low("gpu_hours"), r.high("gpu_hours"), ",.0f"),
            _span(r.low("gpu_hours_lost"), r.high("gpu_hours_lost"), ",.1f"),
            _span(r.low("interruptions"), r.high("interruptions"), ".0f"),
            _span(r.low("unfinished"), r.high("unfinished"), ".0f"),
        ])
    return headers, body


def format_table(rows: Sequence[StrategySummary] | Sequence[SeedRange]) -> str:
    """A plain-text table, one strategy per line; savings relative to the first row (per seed)."""
    headers, body = _cells(rows)
    cells = [headers, *body]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def format_markdown(rows: Sequence[StrategySummary] | Sequence[SeedRange]) -> str:
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

    def save(fig: Any, ax: Any, name: str, heading: str, xlabel: str, ylabel: str) -> Path:
        """Label, title and grid the axes, write the figure as ``name`` and close it."""
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{heading}{': ' + title if title else ''}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        p = out_dir / name
        fig.savefig(p, dpi=120)
        plt.close(fig)
        return p

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for k, r in enumerate(rows):
        ax.scatter(r.miss_rate * 100, r.cost_usd, s=60)
        ax.annotate(r.strategy, (r.miss_rate * 100, r.cost_usd), textcoords="offset points",
                    xytext=(6, 4 if k % 2 == 0 else -12), fontsize=8)
    costs = save(
        fig, ax, "cost_vs_misses.png", "Cost vs deadline misses",
        "deadline-miss rate (% of jobs with a deadline)", "total cost (USD)",
    )  # fmt: skip

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for res in results:
        done = sorted(o.completion_h for o in res.outcomes if o.completion_h is not None)
        if not done:
            continue
        n = len(res.outcomes)
        ax.step(done, [(k + 1) / n for k in range(len(done))], where="post", label=res.strategy)
    ax.set_xscale("log")
    ax.legend(fontsize=8)
    cdf = save(
        fig, ax, "completion_cdf.png", "Completion time CDF",
        "completion time, arrival to finish (hours, log scale)", "share of jobs finished",
    )  # fmt: skip
    return [costs, cdf]
