"""Issue #16's targets against what one GPU session measured: `python docs/scripts/issue16_targets.py DIR`
reads what `bash docs/scripts/gpu_session.sh first` (or its parts) wrote into DIR and prints one markdown
table, a row per target: the measured figure, met or not, and the file it came from. A file that is missing
leaves its rows "not measured"; nothing is assumed.

- DIR/steps-length.json (`longswift bench-steps --json`, the 8B shape, the CUDA default attention): the AR
  step's share of the bandwidth floor at the contexts nearest 4K and 100K (target >= 70%), the default verify
  pass (the projection's node budget) at 100K as a multiple of the AR step (<= 1.3x), and the projected minutes
  for 100K new tokens after a 4K prompt at alpha 0.8 (< 10);
- DIR/ar-smollm2-135m.txt (docs/scripts/gpu_ar_throughput.py): the embedded model's shape, AR as a loaded file
  runs it by default (graphs on, token blocks, colocated weights, length attention if it ran, else bucketed),
  the median of its runs: a proxy for the embedded model's AR (target >= 5x the issue's 59 tok/s);
- DIR/cell/results.csv (`longswift bench`, the embedded GGUF): its AR tok/s (the target itself, where present)
  and TokenSwift's speed against AR in every cell (>= 0.97x: never more than 3% slower);
- DIR/tests.txt (pytest's summary line): whether the CUDA tests passed."""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

FLOOR_SHARE = 0.70  # AR step: at least this share of the bandwidth floor
VERIFY_RATIO = 1.3  # the default verify pass at 100K: at most this multiple of an AR step
PROJECTED_MINUTES = 10.0  # 100K new tokens after a 4K prompt at alpha 0.8: under this
EMBEDDED_AR = 5 * 59.2  # tok/s: five times the embedded model's AR at the start (H100, bf16)
SLOWEST_RATIO = 0.97  # TokenSwift against AR in any bench cell: never more than 3% slower
ALPHA = 0.8


@dataclass
class Row:
    target: str
    measured: str
    met: bool | None  # None: not measured
    source: str

    def line(self) -> str:
        verdict = "not measured" if self.met is None else ("**met**" if self.met else "**not met**")
        return f"| {self.target} | {self.measured} | {verdict} | {self.source} |"


def nearest(contexts: list[dict], context: int) -> dict:
    return min(contexts, key=lambda c: abs(c["context"] - context))


def steps_rows(path: Path) -> list[Row]:
    targets = [f"AR step >= {FLOOR_SHARE:.0%} of the bandwidth floor at 4K",
               f"AR step >= {FLOOR_SHARE:.0%} of the bandwidth floor at 100K",
               f"default verify pass at 100K <= {VERIFY_RATIO}x an AR step",
               f"100K new tokens after 4K at alpha {ALPHA} projected under {PROJECTED_MINUTES:.0f} min"]
    if not path.is_file():
        return [Row(t, "-", None, f"{path.name} missing") for t in targets]
    data = json.loads(path.read_text())
    contexts, nodes = data["contexts"], data["projection"]["tree_nodes"]
    source = f"{path.name} ({data['identity'].get('device_name', data['identity'].get('device'))})"
    rows = []
    for target, context in zip(targets, (4096, 100_000)):
        c = nearest(contexts, context)
        share = c["floor"] / c["ar"]
        rows.append(Row(target, f"{share:.0%} at {c['context']:,} ({c['ar'] * 1e3:.2f} ms, floor "
                                f"{c['floor'] * 1e3:.2f} ms)", share >= FLOOR_SHARE, source))
    c = nearest(contexts, 100_000)
    verify = c["verify"].get(str(nodes))
    if verify is None:
        rows.append(Row(targets[2], f"no {nodes}-node verify measured", None, source))
    else:
        ratio = verify / c["ar"]
        rows.append(Row(targets[2], f"{ratio:.2f}x at {c['context']:,} ({nodes} nodes: {verify * 1e3:.2f} ms)",
                        ratio <= VERIFY_RATIO, source))
    runs = [r for r in data["projection"]["runs"] if abs(r["alpha"] - ALPHA) < 1e-9]
    if not runs:
        rows.append(Row(targets[3], f"no projection at alpha {ALPHA}", None, source))
    else:
        r = runs[0]
        minutes = r["tokenswift_seconds"] / 60
        rows.append(Row(targets[3], f"{minutes:.1f} min ({r['new_tokens']:,} after {r['prefix']:,}; AR "
                                    f"{r['ar_seconds'] / 60:.1f} min)", minutes < PROJECTED_MINUTES, source))
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
        graphs, every, attention, colocated, fused, rate = m.groups()
        if graphs == "on" and int(every) > 1 and colocated == "True" and fused == "True":
            runs.setdefault(attention, []).append(float(rate))
    attention = "length" if "length" in runs else "bucketed" if "bucketed" in runs else None
    if attention is None:
        return None
    return statistics.median(runs[attention]), f"{attention}, median of {len(runs[attention])}"


def cell_rows(csv_path: Path, ar_path: Path) -> list[Row]:
    ar_target = f"embedded model AR >= {EMBEDDED_AR:.0f} tok/s (5x 59.2)"
    ratio_target = f"TokenSwift >= {SLOWEST_RATIO}x AR in every bench cell"
    rows: list[Row] = []
    # A cell: one prompt, preset and length; its figure per method is the median of its runs' decode tok/s,
    # as the bench report gives it.
    rates: dict[tuple[str, ...], dict[str, list[float]]] = {}
    for r in csv.DictReader(csv_path.open()) if csv_path.is_file() else []:
        cell = (r["prompt"], r["preset"], r["prefix"], r["length"])
        rates.setdefault(cell, {}).setdefault(r["method"], []).append(float(r["decode_tokens_per_second"]))
    medians = {cell: {m: statistics.median(v) for m, v in methods.items()} for cell, methods in rates.items()}
    ar = [(m["ar"], cell) for cell, m in medians.items() if "ar" in m]
    if ar:
        rate, cell = min(ar)
        rows.append(Row(ar_target, f"{rate:.1f} tok/s (the slowest of {len(ar)} cells: {cell[1]}, "
                                   f"{cell[2]}+{cell[3]})", rate >= EMBEDDED_AR, f"cell/{csv_path.name}"))
    elif (proxy := shape_ar(ar_path)) is not None:
        rate, how = proxy
        rows.append(Row(ar_target, f"{rate:.1f} tok/s on the shape with random weights ({how}; a proxy: the "
                                   "GGUF's cell measures the target)", rate >= EMBEDDED_AR, ar_path.name))
    else:
        rows.append(Row(ar_target, "-", None, f"{ar_path.name} and cell/{csv_path.name} missing"))
    ratios = [(f"{method} {cell[1]} {cell[2]}+{cell[3]}", rate / m["ar"]) for cell, m in medians.items() if "ar" in m
              for method, rate in m.items() if method.startswith("tokenswift")]
    if not ratios:
        rows.append(Row(ratio_target, "-", None, f"cell/{csv_path.name} missing"))
    else:
        name, worst = min(ratios, key=lambda x: x[1])
        rows.append(Row(ratio_target, f"slowest {worst:.2f}x ({name}; {len(ratios)} cells)", worst >= SLOWEST_RATIO,
                        f"cell/{csv_path.name}"))
    return rows


def tests_row(path: Path) -> Row:
    target = "tests/test_cuda.py, test_attention.py, test_cuda_graphs.py pass on the GPU"
    if not path.is_file():
        return Row(target, "-", None, f"{path.name} missing")
    summary = next((line.strip("= \n") for line in reversed(path.read_text().splitlines())
                    if re.search(r"\d+ (passed|failed|error)", line)), None)
    if summary is None:
        return Row(target, "no summary line (stopped?)", False, path.name)
    failed = re.search(r"\d+ (failed|errors?)\b", summary) is not None
    return Row(target, summary, not failed and "passed" in summary, path.name)


def report(out: Path) -> str:
    rows = [tests_row(out / "tests.txt"), *steps_rows(out / "steps-length.json"),
            *cell_rows(out / "cell" / "results.csv", out / "ar-smollm2-135m.txt")]
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
