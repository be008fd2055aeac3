"""Pictures of a benchmark run: the latency distribution and the lag over time, as one SVG or PNG.

    .venv/bin/python -m bench.apply_bench --plot docs/assets/apply-latency.svg

matplotlib is an optional dependency (``pip install -e '.[plots]'``): it is imported only when a
picture is asked for, so the benchmarks run without it. The figure has two panels:

- the distribution of commit → visible latencies (a histogram, with p50, p90 and p99 marked);
- the latency over the run: per second of commit time, the median and the p99 of the
  transactions committed in that second, and the highest — a lag that stays bounded is a flat
  band, one that grows is a rising one.

The output is deterministic for the same numbers (no date, a fixed hash salt), so a picture
checked in changes only when a run's figures do.
"""

from __future__ import annotations

import statistics
from pathlib import Path


def _per_second(points: list[tuple[float, float]]) -> tuple[list[float], list[float], list[float], list[float]]:
    """``points`` (seconds since start, latency) grouped by whole second: the seconds, and per
    second the median, the p99 and the highest latency."""
    groups: dict[int, list[float]] = {}
    for at, latency in points:
        groups.setdefault(int(at), []).append(latency)
    seconds, p50, p99, top = [], [], [], []
    for second in sorted(groups):
        values = sorted(groups[second])
        seconds.append(second + 0.5)
        p50.append(statistics.median(values))
        p99.append(values[min(len(values) - 1, int(0.99 * len(values)))])
        top.append(values[-1])
    return seconds, p50, p99, top


def latency_figure(path: Path, committed: list[float], latencies: list[float], title: str) -> Path:
    """Writes the two panels for transactions committed at ``committed`` (epoch seconds) and made
    visible ``latencies`` seconds later; the format follows the suffix (``.svg``, ``.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "lakeslot"
    plt.rcParams["svg.fonttype"] = "none"  # text as text: small, searchable files
    start = min(committed)
    quantiles = statistics.quantiles(latencies, n=100)
    figure, (distribution, over_time) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    figure.suptitle(title, fontsize=11)

    distribution.hist(latencies, bins=60, color="#4c72b0")
    for q, label, style in ((49, "p50", "-"), (89, "p90", "--"), (98, "p99", ":")):
        distribution.axvline(quantiles[q], color="#c44e52", linestyle=style,
                             label=f"{label} {quantiles[q]:.2f} s")
    distribution.set_xlabel("commit in PostgreSQL → visible in Iceberg (s)")
    distribution.set_ylabel("transactions")
    distribution.legend(frameon=False)

    seconds, p50, p99, top = _per_second([(t - start, lat) for t, lat in zip(committed, latencies,
                                                                             strict=True)])
    over_time.fill_between(seconds, p50, top, color="#4c72b0", alpha=0.15, label="up to the highest")
    over_time.plot(seconds, p99, color="#c44e52", linewidth=1, label="p99")
    over_time.plot(seconds, p50, color="#4c72b0", linewidth=1.5, label="median")
    over_time.set_xlabel("commit time (s since the writer started)")
    over_time.set_ylabel("latency of that second's commits (s)")
    over_time.set_ylim(bottom=0)
    over_time.legend(frameon=False, loc="upper left")

    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)
    plt.close(figure)
    return path
