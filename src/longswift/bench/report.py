"""Benchmark outputs from the stored runs (store.py: the resumable results directory): results.csv, PNG
plots (matplotlib, if installed) and report.md."""

from __future__ import annotations

import csv
import importlib.util
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_atomic
from ..config import SamplingConfig
from .machine import machine_lines, software_versions
from .metrics import checkpoint_targets, speedup, time_to
from .peers import sampler_note
from .store import MemoryStore

CSV_SKIP = ("token_ids", "checkpoints", "checkpoint_alpha", "sampling", "key", "stage_seconds", "command", "versions")


@dataclass
class RunContext:
    """What the report says besides the numbers."""

    identity: dict[str, Any]
    command: str
    skipped: dict[str, str]
    notes: dict[str, str]
    spec: Any
    methods: tuple[str, ...]
    cells: list[dict[str, Any]] = field(default_factory=list)
    resumed: int = 0  # runs found in the results directory when this invocation started
    variants: tuple[str, ...] = ()  # this invocation's TokenSwift variant labels (its options)
    # the software this invocation measures with (software_versions), kept in its records too
    versions: dict[str, str | None] = field(default_factory=lambda: software_versions())


def cell_id(r: dict[str, Any]) -> tuple:
    """A report cell: the prompt (by name, length and its ids' digest: records written before bench kept the
    digest have None), the preset and the length."""
    return (r["prompt"], r["prompt_tokens"], r["preset"], r["length"], r.get("prompt_digest"))


def cell_ids(records: list[dict[str, Any]]) -> list[tuple]:
    """Each record's cell_id, a record without the digest joining the cell of the one digest its title (name,
    length, preset, length) has among the records, if one: the runs of a directory made before bench kept it,
    resumed with more runs of the same prompt, stay one cell."""
    ids = [cell_id(r) for r in records]
    digests: dict[tuple, set] = {}
    for cid in ids:
        if cid[4] is not None:
            digests.setdefault(cid[:4], set()).add(cid[4])
    return [(*cid[:4], next(iter(digests[cid[:4]]))) if cid[4] is None and len(digests.get(cid[:4], ())) == 1
            else cid for cid in ids]


def row_id(r: dict[str, Any]) -> tuple[str, str]:
    return (r["method"], r["variant"])


def group(records: list[dict[str, Any]]) -> dict[tuple, dict[tuple[str, str], list[dict[str, Any]]]]:
    """cell -> (method, variant) -> runs, in the order first seen."""
    out: dict[tuple, dict[tuple[str, str], list[dict[str, Any]]]] = {}
    for r, cid in zip(records, cell_ids(records)):
        out.setdefault(cid, {}).setdefault(row_id(r), []).append(r)
    return out


def median_rate(runs: list[dict[str, Any]]) -> float:
    return statistics.median(r["decode_tokens_per_second"] for r in runs)


def baseline(rows: dict[tuple[str, str], list[dict[str, Any]]], method: str) -> list[dict[str, Any]] | None:
    return next((runs for (m, _), runs in rows.items() if m == method), None)


def partner(run: dict[str, Any], base: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The baseline's run that `run` was timed in lockstep with (the same run index, the baseline named in its
    lockstep_with), or None."""
    if base and base[0]["method"] in (run.get("lockstep_with") or []):
        return next((b for b in base if b["run"] == run["run"]), None)
    return None


def vs(runs: list[dict[str, Any]], base: list[dict[str, Any]] | None) -> float | None:
    """How many times faster `runs` are than the baseline's: the median of the per-run ratios where every run
    was timed in lockstep with the baseline's run (the pairing lockstep exists for: both met the same drift),
    else the ratio of the medians; None where a rate is 0 (nothing timed)."""
    if not base:
        return None
    pairs = [(r["decode_tokens_per_second"], p["decode_tokens_per_second"]) for r in runs if (p := partner(r, base))]
    if len(pairs) == len(runs) and all(a > 0 and b > 0 for a, b in pairs):
        return statistics.median(a / b for a, b in pairs)
    rate, base_rate = median_rate(runs), median_rate(base)
    return speedup(rate, base_rate) if rate > 0 and base_rate > 0 else None


def write_outputs(store: MemoryStore, ctx: RunContext, out_dir: Path | None, plots: bool) -> str:
    """(Re)write results.csv, the plots and report.md from every record; return the report."""
    records = store.records
    images: list[str] = []
    missing = None
    if out_dir is not None:
        write_atomic(out_dir / "results.csv", to_csv(records))
        from .plots import plot_all, stale_plots

        if plots:
            images = plot_all(records, out_dir)
            if records and importlib.util.find_spec("matplotlib") is None:  # said, not silently left out
                missing = "No plots: matplotlib is not installed (`pip install matplotlib`, then run again to add them)."
        stale_plots(out_dir, images)
    report = render(records, ctx, images, missing)
    if out_dir is not None:
        write_atomic(out_dir / "report.md", report)
    return report


def to_csv(records: list[dict[str, Any]]) -> str:
    cells = group(records)
    rows = []
    for r, cid in zip(records, cell_ids(records)):
        row = {k: v for k, v in r.items() if k not in CSV_SKIP}
        if isinstance(row.get("lockstep_with"), list):  # a list in one cell: the methods joined by '+'
            row["lockstep_with"] = "+".join(row["lockstep_with"])
        for base in ("ar", "hf"):  # against the run it was timed in lockstep with, else the baseline's median
            ratio = vs([r], baseline(cells[cid], base))
            row[f"speedup_vs_{base}"] = round(ratio, 4) if ratio is not None else ""
        rows.append(row)
    buf = io.StringIO()
    if rows:
        fields = list(dict.fromkeys(k for row in rows for k in row))  # records of older versions may lack a field
        writer = csv.DictWriter(buf, fieldnames=fields, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _drafted(runs: list[dict[str, Any]]) -> str:
    """' (D of S)': how many of a TokenSwift row's steps drafted (verified a trie; medians over runs),
    the sample its alpha comes from, of its steps after the first token (the prefill's, which drafts nothing:
    eval-heads counts the same way); '' for AR, peers and records made before bench kept these counts."""
    if any(r.get("verify_steps") is None or r.get("steps") is None for r in runs):
        return ""
    drafted = statistics.median(r["verify_steps"] for r in runs)
    return f" ({drafted:g} of {statistics.median(r['steps'] - 1 for r in runs):g})"


def render(records: list[dict[str, Any]], ctx: RunContext, images: list[str], plots_note: str | None = None) -> str:
    ident = ctx.identity
    prompt = (f"random token ids (seed {ident['seed']})" if ident["prompt_file"] is None
              else f"{ident['prompt_file']}{' as chat messages' if ident['chat'] else ''}")
    lines = ["## longswift bench", "", f"`{ctx.command}`", "", *machine_lines(ident, records, ctx.versions),
             f"- prompt: {prompt}"]
    if ctx.resumed:
        lines.append(f"- resumed: {ctx.resumed} of the {len(records)} runs below were measured by earlier invocations "
                     "into the same --out-dir (same model, prompt, seed, dtype and threads; possibly a smaller grid)")
    if ctx.spec is not None and any(m.startswith("tokenswift") for m in ctx.methods):
        budget = f", at most {ctx.spec.max_nodes} nodes" if ctx.spec.max_nodes else ""
        others = {r["variant"] for r in records if r["method"].startswith("tokenswift")} - set(ctx.variants)
        whose = " of this invocation" if others else ""
        lines.append(f"- tokenswift options{whose}: {ctx.spec.tree} tree, n-gram top-k {ctx.spec.ngram_topk}{budget}, "
                     f"draft KV budget {ctx.spec.draft_kv_budget} ({ctx.spec.draft_cache}), adaptive steps "
                     f"{'on' if ctx.spec.adaptive else 'off'}"
                     + ("; rows measured with other options name theirs in the variant column" if others else ""))
    if any(r["method"].startswith("tokenswift") for r in records):  # (an earlier invocation's rows too)
        if ident["dtype"] != "float64":
            # float32 keeps ~7 digits; bfloat16 ~3 and float16 ~4 (their logits move by tenths)
            rounding = "~1e-6 relative" if ident["dtype"] == "float32" else "~1e-3 to 1e-2 relative"
            lines.append(f"- tokenswift outputs equal ar's token for token in float64; in {ident['dtype']} the verify "
                         f"pass's multi-token sums round differently ({rounding}) from the decode step's, so a "
                         "draw within that rounding of a boundary between two tokens can go the other way (the "
                         "'first differs' lines below; rare in float32, common in bfloat16)")
    if any(r["method"].startswith("llamacpp") for r in records):
        lines.append("- llama.cpp runs its own kernels on the GGUF's stored weights (quantized types stay quantized), "
                     "while longswift and transformers run the weights dequantized to the dtype above: its speed is "
                     "that of a different numeric format and its tokens are not comparable with ours")
    # every row's sampler note, those an earlier invocation measured included (ctx.notes holds this one's)
    notes = dict(ctx.notes)
    for r in records:
        note = sampler_note(r["method"], SamplingConfig(**r["sampling"]))
        if note:
            notes.setdefault(f"{r['method']}, {r['preset']}", note)
    for what, note in notes.items():
        lines.append(f"- sampler of {what}: {note}")
    for what, why in ctx.skipped.items():
        lines.append(f"- {what}: skipped ({why})")
    lines.append("- decode tok/s counts the tokens after the first: ours over the time after their own prefill "
                 "(prefill s), a peer's over the time after its first token arrived; "
                 "medians over runs (lockstep rows: \"vs ar\" is the median of each run's ratio to the ar run it ran "
                 "with); "
                 "peak memory is the resident set of the whole process during the run (CUDA: allocator peak), so it "
                 "includes every method loaded so far; the part in parentheses is what the run added on top")
    captured = [r for r in records if r.get("graph_capture_seconds")]
    if captured:  # one-off costs a longer run amortizes; kept in each record
        share = sum(r["graph_capture_seconds"] for r in captured) / sum(r["decode_seconds"] for r in captured)
        lines.append(f"- decode time includes capturing CUDA graphs: {100 * share:.1f}% of the decode time of the runs "
                     f"that captured any ({len(captured)} of {len(records)}; graph_capture_seconds in results.jsonl)")
    if ctx.identity.get("lockstep"):
        lines.append("- lockstep (--lockstep): our methods' runs of a cell and run ran together, a step at a time, the "
                     "one furthest behind in tokens next, each timed on its own clock, so that the machine's drift "
                     "hit them alike; the peak memory of runs made together is that of all of them at once")
    lines += ["", *[f"![{Path(i).stem}]({i})" for i in images], *([plots_note] if plots_note else [])]
    cells = group(records)
    titles = [cid[:4] for cid in cells]
    for cid, rows in cells.items():  # the ids' digest in a title only where two cells would share it
        lines += _cell_section(cid, rows, titles.count(cid[:4]) > 1)
    return "\n".join(lines) + "\n"


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    """The median of a row's runs' `key` over the runs where it is defined, or None where none is (AR's alpha). A
    run that drafted nothing has no alpha (nor n-gram alpha): its record says null, or, made before it did, 0.0
    beside draft_positions 0; counted as 0, a median of 0.5, 0.7 and it said 0.5."""
    undefined = ("alpha", "ngram_alpha")
    values = [r[key] for r in runs if r[key] is not None and not (key in undefined and r.get("draft_positions") == 0)]
    return statistics.median(values) if values else None


def _memory(runs: list[dict[str, Any]]) -> str:
    peak = statistics.median(r["peak_memory_bytes"] for r in runs) / 2**20
    if runs[0].get("memory_at_start_bytes") is None:  # records written before the start was kept
        return f"{peak:.0f}"
    added = statistics.median(r["peak_memory_bytes"] - r["memory_at_start_bytes"] for r in runs) / 2**20
    return f"{peak:.0f} (+{added:.0f})"


def _row_label(rows: dict[tuple[str, str], list[dict[str, Any]]], method: str, variant: str) -> str:
    """A row's name in the lines about a cell's rows: the method, with its variant where the cell has
    several rows of that method (ablations)."""
    several = sum(1 for m, _ in rows if m == method) > 1
    return f"{method} ({variant})" if variant and several else method


def _invocations(rows: dict[tuple[str, str], list[dict[str, Any]]]) -> str | None:
    """Which invocation of bench measured each row's runs, numbered by when they finished, where a cell's
    rows come from more than one (after a resume); None where all come from one. Records written before
    invocations were recorded count as one earlier invocation."""
    runs = sorted((r for rs in rows.values() for r in rs), key=lambda r: r["finished_at"])
    order = {inv: i for i, inv in enumerate(dict.fromkeys(r.get("invocation") for r in runs), 1)}
    if len(order) < 2:
        return None
    return ", ".join(f"{_row_label(rows, m, variant)} "
                     + "+".join(str(n) for n in sorted({order[r.get('invocation')] for r in rs}))
                     for (m, variant), rs in rows.items())


def _differs(want: list[int], got: list[int]) -> str | None:
    """How `got` differs from `want` (ar's tokens), or None where they are the same tokens."""
    diverge = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), None)
    if diverge is not None:
        return f"first differs at new token {diverge}"
    if len(got) != len(want):
        return f"holds {len(got)} tokens where ar's holds {len(want)} (the same up to there)"
    return None


def _cell_section(cid: tuple, rows: dict[tuple[str, str], list[dict[str, Any]]], digest: bool = False) -> list[str]:
    name, prompt_tokens, preset, length, ids = cid
    ar, hf = baseline(rows, "ar"), baseline(rows, "hf")
    which = f" (prompt ids {ids[:8]})" if digest and ids else (" (prompt ids not recorded)" if digest else "")
    lines = ["", f"### {name}{which}: {prompt_tokens}-token prompt, {length} new tokens, {preset} sampling", ""]
    if ar:
        same = []
        for (m, variant), runs in rows.items():
            if m == "ar":
                continue
            # every run (all of a cell's runs take one seed), and their lengths: the first run alone, compared up
            # to the shorter of the two, was reported identical with a later run or a shorter record differing
            verdicts = [(k, _differs(ar[0]["token_ids"], r["token_ids"])) for k, r in enumerate(runs)]
            differing = next(((k, v) for k, v in verdicts if v is not None), None)
            label = _row_label(rows, m, variant)
            if differing is None:
                same.append(f"{label} identical" + (f" in all {len(runs)} runs" if len(runs) > 1 else ""))
            else:
                same.append(f"{label}{f' run {differing[0] + 1}' if len(runs) > 1 else ''} {differing[1]}")
        if same:
            lines += [f"- outputs compared with ar's first run: {'; '.join(same)}", ""]
    alone = [f"{_row_label(rows, m, variant)} run {r['run'] + 1}" for (m, variant), runs in rows.items()
             for r in runs if r.get("lockstep_with") == []]
    if alone:
        lines += [f"- not in lockstep (no other method of ours was left to run with it in its cell and run): "
                  f"{', '.join(alone)}; its rate was measured alone", ""]
    apart = _invocations(rows)
    if apart:
        lines += [f"- measured by different invocations (1 = earliest): {apart}; a ratio between rows measured apart "
                  "compares different machine conditions (a new --out-dir measures them side by side)", ""]
    lines += ["| method | variant | runs | prefill s | decode tok/s | ms/token | vs ar | vs hf | alpha (drafted of steps after the first) | "
              "n-gram alpha | "
              "tokens/step | distinct-1/2/3/4 | peak MiB (+ added by the run) |", "|" + "---|" * 13]
    for (m, variant), runs in rows.items():
        rate = median_rate(runs)
        med = lambda k: _median(runs, k)  # noqa: E731
        ratios = [vs(runs, b) for b in (ar, hf)]
        cols = [f"{x:.2f}x" if x is not None else "-" for x in ratios]
        distinct = "/".join(f"{med(f'distinct_{n}'):.2f}" for n in (1, 2, 3, 4))
        timed = rate > 0  # 0: every token arrived in one block, no decode time to divide by
        lines.append(f"| {m} | {variant or '-'} | {len(runs)} | {med('prefill_seconds'):.2f} | "
                     f"{_fmt(rate if timed else None, '.1f')} | {_fmt(1e3 / rate if timed else None, '.1f')} | "
                     f"{cols[0]} | {cols[1]} | {_fmt(med('alpha'))}{_drafted(runs)} | "
                     f"{_fmt(med('ngram_alpha'))} | {_fmt(med('tokens_per_step'))} | {distinct} | "
                     f"{_memory(runs)} |")
    if ar and len(rows) > 1:
        lines += ["", "Speedup vs ar along the generation (decode time until each method held the same token count, "
                      "first run):", ""]
        # (each method's time to each is exact: metrics.time_to). Not the first token, which every method takes from
        # the prefill's logits: the time to it is when a method hands it over (AR after one more forward, a drafting
        # method with its first step), not decode speed; a count of 1 is a target at lengths under 12.
        header = [n for n in checkpoint_targets(length) if n > 1]
        lines += ["| method | " + " | ".join(str(n) for n in header) + " |", "|" + "---|" * (len(header) + 1)]
        base = [time_to(ar[0]["checkpoints"], n, ar[0]["prefill_seconds"]) for n in header]
        for (m, variant), runs in rows.items():
            if m == "ar":
                continue
            mine = [time_to(runs[0]["checkpoints"], n, runs[0]["prefill_seconds"]) for n in header]
            cells = [f"{theirs / t:.2f}x" if theirs and t else "-" for theirs, t in zip(base, mine)]
            lines.append(f"| {_row_label(rows, m, variant)} | " + " | ".join(cells) + " |")
    return lines
