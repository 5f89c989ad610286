"""``python -m sfengine.plot``: PNG curves of one run or of several side by side, from their TensorBoard files.

    python -m sfengine.plot --experiment=spatial                           # <train_dir>/spatial/curves.png
    python -m sfengine.plot --experiment=spatial --experiment=spatial_rloo --out=compare.png

One row per metric that any of the runs recorded (training return and success, the evaluator's success and
return, FPS), against env steps on the left and against wall-clock time on the right; one colour per run.
``plot_metrics`` draws the same figure from any series, so the benchmarks use it for their own records.

Exit codes: 0 written, 2 bad input (an experiment without TensorBoard records), reported on one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

# Row label -> TensorBoard tag, in the order the rows are drawn.
METRICS = {
    "return (training episodes)": "episodes/episode_return_mean",
    "success (training episodes)": "episodes/success_rate",
    "success (evaluation)": "eval/success",
    "return (evaluation)": "eval/return",
    "FPS (60 s window)": "perf/fps_60s",
}


class Series(NamedTuple):
    """One line: a run's values with the env step and the seconds since the run's first record of each."""

    label: str | None  # None: no legend entry (another line of the same label has it)
    steps: list[int]
    seconds: list[float]
    values: list[float]
    color: str | None = None


def plot_metrics(
    metrics: dict[str, list[Series]],
    path: Path,
    title: str = "",
    log_time: bool = False,
    references: dict[str, list[tuple[str, float]]] | None = None,
) -> Path:
    """A PNG with one row per metric (its series against env steps, and against wall-clock seconds).
    ``references``: per metric, horizontal lines (label, value) such as a published figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [name for name, series in metrics.items() if any(s.values for s in series)]
    figure, axes = plt.subplots(len(rows), 2, figsize=(12, 3.6 * len(rows)), squeeze=False)
    for (by_steps, by_time), name in zip(axes, rows):
        for series in metrics[name]:
            style = {"color": series.color, "label": series.label, "linewidth": 1.2}
            by_steps.plot(series.steps, series.values, **style)
            by_time.plot(series.seconds, series.values, **style)
        for label, value in (references or {}).get(name, []):
            by_steps.axhline(value, color="gray", linestyle="--", label=label)
        by_steps.set(xlabel="env steps", ylabel=name)
        by_time.set(xlabel="wall-clock seconds", ylabel=name)
        if log_time:
            by_time.set_xscale("log")
        for axis in (by_steps, by_time):
            axis.grid(alpha=0.3)
        by_steps.legend(loc="best", fontsize="small")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    figure.savefig(tmp, dpi=90)
    plt.close(figure)
    tmp.replace(path)
    return path


def run_series(experiment_dir: Path, label: str, color: str | None = None) -> dict[str, Series]:
    """A run's curves from its TensorBoard files, by metric row. Raises FileNotFoundError without any."""
    # Imported here: tensorboardX's package imports torch (seconds), which --help does not need.
    from sfengine.reporting.events import read_scalars

    curves = read_scalars(experiment_dir)
    if not curves:
        raise FileNotFoundError(f"no TensorBoard records in {experiment_dir / 'tensorboard'}")
    start = min(points[0].wall_time for points in curves.values() if points)
    series = {}
    for name, tag in METRICS.items():
        points = curves.get(tag, [])
        series[name] = Series(
            label, [p.step for p in points], [p.wall_time - start for p in points], [p.value for p in points], color
        )
    return series


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sfengine.plot", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("--experiment", action="append", required=True, help="a run to plot; repeat for several")
    parser.add_argument("--train_dir", default="train_dir", help="directory that holds experiment directories")
    parser.add_argument(
        "--out",
        default=None,
        help="PNG path (default: <train_dir>/<experiment>/curves.png for one run, "
        "<train_dir>/compare_<a>_vs_<b>.png for several)",
    )
    args = parser.parse_args(argv)
    train_dir = Path(args.train_dir)
    colors = [f"C{i % 10}" for i in range(len(args.experiment))]
    metrics: dict[str, list[Series]] = {name: [] for name in METRICS}
    try:
        for experiment, color in zip(args.experiment, colors):
            for name, series in run_series(train_dir / experiment, experiment, color).items():
                metrics[name].append(series)
    except FileNotFoundError as exc:
        print(f"sfengine.plot: error: {exc}; check --train_dir and --experiment", file=sys.stderr)
        return 2
    if args.out:
        out = Path(args.out)
    elif len(args.experiment) == 1:
        out = train_dir / args.experiment[0] / "curves.png"
    else:
        out = train_dir / f"compare_{'_vs_'.join(args.experiment)}.png"
    plot_metrics(metrics, out, title=" vs ".join(args.experiment))
    print(f"written {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
