"""Issue #16's targets against what one GPU session measured: `python docs/scripts/issue16_targets.py DIR`
reads what `bash docs/scripts/gpu_session.sh first` (or its parts) wrote into DIR and prints one markdown
table, a row per target: the measured figure, met or not, and the file it came from. A file that is missing,
or that measured other sizes than the target names, leaves its rows "not measured"; nothing is assumed.

- DIR/steps-length.json (`longswift bench-steps --json`, the 8B shape, the CUDA default attention): the AR
  step's share of the bandwidth floor at 4K and 100K context (target >= 70%), the default verify pass (the
  projection's node budget) at 100K as a multiple of the AR step (<= 1.3x), and the projected minutes for
  100K new tokens after a 4K prompt at alpha 0.8 (< 10); DIR/steps-triton.json, where present: the same
  with --triton-kernels (its rows named so);
- DIR/ar-smollm2-135m.txt (docs/scripts/gpu_ar_throughput.py): the embedded model's shape, AR as a loaded file
  runs it by default (graphs on, token blocks, colocated weights, length attention if it ran, else bucketed),
  the median of its runs: a proxy for the embedded model's AR (target: 5x the issue's starting point);
- DIR/cell/results.jsonl (`longswift bench`, the embedded GGUF): its AR per preset against 5x that preset's
  starting point (the target itself, where present), and TokenSwift's speed against AR in every cell
  (>= 0.97x: never more than 3% slower);
- DIR/tests.txt (pytest's summary line) with DIR/versions.txt (the GPU it ran on): whether the CUDA tests
  passed on a GPU."""

from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from longswift.bench.report import baseline, group, median_rate

FLOOR_SHARE = 0.70  # AR step: at least this share of the bandwidth floor
VERIFY_RATIO = 1.3  # the default verify pass at 100K: at most this multiple of an AR step
PROJECTED_MINUTES = 10.0  # 100K new tokens after a 4K prompt at alpha 0.8: under this
PREFIX, NEW_TOKENS, ALPHA = 4096, 100_000, 0.8
CONTEXT_SLACK = 0.1  # a measured context within 10% of 4K or 100K stands for it
# The embedded model's AR on the H100 at the start (bfloat16, 2K prompt + 4K tokens; the issue names
# the greedy figure): the target is five times each preset's.
START_AR = {"greedy": 59.2, "paper": 45.5}
SPEEDUP = 5
SLOWEST_RATIO = 0.97  # TokenSwift against AR in any bench cell: never more than 3% slower


@dataclass
class Row:
    target: str
    measured: str
    met: bool | None  # None: not measured
    source: str

    def line(self) -> str:
        verdict = "not measured" if self.met is None else ("**met**" if self.met else "**not met**")
        return f"| {self.target} | {self.measured} | {verdict} | {self.source} |"


def at(contexts: list[dict], context: int) -> dict | None:
    """The measured context that stands for `context` (within CONTEXT_SLACK), or None."""
    c = min(contexts, key=lambda c: abs(c["context"] - context))
    return c if abs(c["context"] - context) <= CONTEXT_SLACK * context else None


def steps_rows(path: Path, how: str = "") -> list[Row]:
    """The bench-steps targets from `path`; `how`: the option it ran with, added to each target's name."""
    targets = [f"AR step >= {FLOOR_SHARE:.0%} of the bandwidth floor at 4K",
               f"AR step >= {FLOOR_SHARE:.0%} of the bandwidth floor at 100K",
               f"default verify pass at 100K <= {VERIFY_RATIO}x an AR step",
               f"100K new tokens after 4K at alpha {ALPHA} projected under {PROJECTED_MINUTES:.0f} min"]
    targets = [t + how for t in targets]
    if not path.is_file():
        return [Row(t, "-", None, f"{path.name} missing") for t in targets]
    data = json.loads(path.read_text())
    contexts, nodes = data["contexts"], data["projection"]["tree_nodes"]
    source = f"{path.name} ({data['identity'].get('device_name') or data['identity'].get('device')})"  # (None on a CPU)
    measured = ", ".join(f"{c['context']:,}" for c in contexts)
    rows = []
    for target, context in zip(targets, (PREFIX, NEW_TOKENS)):
        c = at(contexts, context)
        if c is None:
            rows.append(Row(target, f"no context near {context:,} (measured: {measured})", None, source))
            continue
        share = c["floor"] / c["ar"]
        rows.append(Row(target, f"{share:.0%} at {c['context']:,} ({c['ar'] * 1e3:.2f} ms, floor "
                                f"{c['floor'] * 1e3:.2f} ms)", share >= FLOOR_SHARE, source))
    c = at(contexts, NEW_TOKENS)
    verify = None if c is None else c["verify"].get(str(nodes))
    if verify is None:
        rows.append(Row(targets[2], f"no {nodes}-node verify near {NEW_TOKENS:,} (measured: {measured})", None,
                        source))
    else:
        ratio = verify / c["ar"]
        rows.append(Row(targets[2], f"{ratio:.2f}x at {c['context']:,} ({nodes} nodes: {verify * 1e3:.2f} ms)",
                        ratio <= VERIFY_RATIO, source))
    runs = [r for r in data["projection"]["runs"]
            if abs(r["alpha"] - ALPHA) < 1e-9 and r["prefix"] == PREFIX and r["new_tokens"] == NEW_TOKENS]
    if not runs:
        rows.append(Row(targets[3], f"no projection of {NEW_TOKENS:,} after {PREFIX:,} at alpha {ALPHA}", None,
                        source))
    else:
        r = runs[0]
        minutes = r["tokenswift_seconds"] / 60
        rows.append(Row(targets[3], f"{minutes:.1f} min (AR {r['ar_seconds'] / 60:.1f} min)",
                        minutes < PROJECTED_MINUTES, source))
    return rows


AR_LINE = re.compile(r"cuda_graphs=(\w+) read_every=(\d+) graph_attention=(\w+) colocated=(\w+) fused_norm=(\w+).*"
                     r"decode ([\d.]+) tok/s")


def shape_ar(path: Path) -> tuple[float, str] | None:
    """The median tok/s of the default runs (graphs on, blocks, colocated, fused kernels), with `length`
    attention where any ran, else bucketed; None if the file has none."""
    if not path.is_file():
        return None
    runs: dict[str, list[float]] = {}
    for m in AR_LINE.finditer(path.read_text()):
        if "triton_kernels=True" in m.group(0):  # opt-in, not what a loaded file runs by default
            continue
        graphs, every, attention, colocated, fused, rate = m.groups()
        if graphs == "on" and int(every) > 1 and colocated == "True" and fused == "True":
            runs.setdefault(attention, []).append(float(rate))
    attention = "length" if "length" in runs else "bucketed" if "bucketed" in runs else None
    if attention is None:
        return None
    return statistics.median(runs[attention]), f"{attention}, median of {len(runs[attention])}"


def cell_rows(results: Path, ar_path: Path) -> list[Row]:
    """The bench cells (runs grouped as the bench report groups them: a cell, then a method and variant)."""
    ar_target = f"embedded model AR >= {SPEEDUP}x the issue's start ({START_AR['greedy']} tok/s greedy)"
    ratio_target = f"TokenSwift >= {SLOWEST_RATIO}x AR in every bench cell"
    source = f"{results.parent.name}/{results.name}"
    records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()] if results.is_file() else []
    cells = group(records)
    rows: list[Row] = []
    ar_cells = [(cell[2], median_rate(runs)) for cell, methods in cells.items()
                if (runs := baseline(methods, "ar")) is not None and cell[2] in START_AR]
    if ar_cells:
        rows.append(Row(ar_target, "; ".join(f"{preset} {rate:.1f} tok/s ({rate / START_AR[preset]:.1f}x "
                                             f"{START_AR[preset]})" for preset, rate in ar_cells),
                        all(rate >= SPEEDUP * START_AR[preset] for preset, rate in ar_cells), source))
    elif (proxy := shape_ar(ar_path)) is not None:
        rate, how = proxy
        rows.append(Row(ar_target, f"{rate:.1f} tok/s greedy on the shape with random weights ({how}; a proxy: "
                                   "the GGUF's cell measures the target)", rate >= SPEEDUP * START_AR["greedy"],
                        ar_path.name))
    else:
        rows.append(Row(ar_target, "-", None, f"{ar_path.name} and {source} missing"))
    ratios = []
    for cell, methods in cells.items():
        ar = baseline(methods, "ar")
        for (method, variant), runs in methods.items():
            if ar is not None and method.startswith("tokenswift"):
                ratios.append((f"{method} {cell[2]} {cell[1]}+{cell[3]}", median_rate(runs) / median_rate(ar)))
    if not ratios:
        rows.append(Row(ratio_target, "-", None, f"{source} missing"))
    else:
        name, worst = min(ratios, key=lambda x: x[1])
        rows.append(Row(ratio_target, f"slowest {worst:.2f}x ({name}; {len(ratios)} method-cells)",
                        worst >= SLOWEST_RATIO, source))
    return rows


def tests_row(path: Path, versions: Path) -> Row:
    target = "tests/test_cuda.py, test_attention.py, test_cuda_graphs.py pass on a GPU"
    if not path.is_file():
        return Row(target, "-", None, f"{path.name} missing")
    summary = next((line.strip("= \n") for line in reversed(path.read_text().splitlines())
                    if re.search(r"\d+ (passed|failed|error)", line)), None)
    if summary is None:
        return Row(target, "no summary line (stopped?)", False, path.name)
    gpu = versions.read_text().splitlines()[0] if versions.is_file() else ""
    if "(no CUDA)" in gpu or not gpu:
        return Row(target, f"{summary}, but not on a GPU ({versions.name}: {gpu or 'missing'})", False, path.name)
    failed = re.search(r"\d+ (failed|errors?)\b", summary) is not None
    return Row(target, summary, not failed and "passed" in summary, f"{path.name} ({gpu})")


def report(out: Path) -> str:
    rows = [tests_row(out / "tests.txt", out / "versions.txt"), *steps_rows(out / "steps-length.json"),
            *cell_rows(out / "cell" / "results.jsonl", out / "ar-smollm2-135m.txt")]
    if (out / "steps-triton.json").is_file():  # the opt-in Triton kernels, where that part ran
        rows += steps_rows(out / "steps-triton.json", " (--triton-kernels)")
    lines = ["| issue #16 target | measured | verdict | from |", "|---|---|---|---|", *(r.line() for r in rows)]
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python docs/scripts/issue16_targets.py DIR  (what gpu_session.sh wrote)")
    out = Path(sys.argv[1])
    if not out.is_dir():
        sys.exit(f"issue16_targets: '{out}' is not a directory: give the folder gpu_session.sh wrote ($OUT)")
    print(report(out), end="")


if __name__ == "__main__":
    main()
