"""Benchmark outputs: the resumable results directory (config.json + results.jsonl, one line per
finished run), results.csv, PNG plots (matplotlib, if installed) and report.md."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import platform
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import OutputLock, write_atomic
from ..errors import LongswiftError
from .metrics import curve_speedup, speedup

OUTPUT_FILES = ("results.jsonl", "results.csv", "report.md", "config.json", "speedup_vs_length.png",
                "alpha_vs_length.png", "time_to_n_tokens.png")
CSV_SKIP = ("token_ids", "checkpoints", "checkpoint_alpha", "sampling", "key", "stage_seconds", "command", "versions")


def absolute(path: str) -> str:
    """A path as the identity keeps it: absolute, so that a relative and an absolute path to one model or
    prompt file resume into the same results ('<embedded>'-style names as they are)."""
    return path if path.startswith("<") else os.path.abspath(path)


def with_absolute_paths(identity: dict[str, Any]) -> dict[str, Any]:
    """An identity stored before bench kept its paths absolute, with them made absolute from here."""
    return {**identity, **{k: absolute(identity[k]) for k in ("model", "prompt_file") if identity.get(k)}}


class MemoryStore:
    """Records of finished runs, kept in memory only (no --out-dir)."""

    def __init__(self, identity: dict[str, Any]) -> None:
        self.identity = identity
        self.records: list[dict[str, Any]] = []
        self._keys: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self._keys

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self._keys.add(record["key"])

    def extend(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            MemoryStore.append(self, record)

    def close(self) -> None:
        """Nothing to release in memory."""


class ResultStore(MemoryStore):
    """A results directory: config.json names what the runs measured; results.jsonl gets one line per
    run, flushed and fsynced as it finishes, so an interrupted grid resumes where it stopped."""

    def __init__(self, out_dir: Path, identity: dict[str, Any], fresh: bool = False,
                 model_fingerprint: str | None = None) -> None:
        super().__init__(identity)
        if out_dir.exists() and not out_dir.is_dir():
            raise LongswiftError(f"--out-dir '{out_dir}' is a file: give a directory")
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LongswiftError(f"cannot create --out-dir '{out_dir}': {exc.strerror}") from None
        self.path = out_dir / "results.jsonl"
        config = out_dir / "config.json"
        # One invocation at a time: two writing one directory ran every run twice (the report took medians over
        # the copies). Held until close().
        self._lock = OutputLock([("--out-dir", self.path)])
        self._lock.__enter__()
        try:
            self._open(out_dir, config, identity, fresh, model_fingerprint)
        except BaseException:
            self._lock.release()
            raise

    def _open(self, out_dir: Path, config: Path, identity: dict[str, Any], fresh: bool,
              fingerprint: str | None) -> None:
        if fresh and config.exists() and _stored_config(config) is None:  # another tool's config.json, not ours
            raise LongswiftError(f"'{config}' is not a longswift bench config, and --fresh discards only a bench "
                                 "directory's files: use another --out-dir")
        if fresh:
            for name in OUTPUT_FILES:
                (out_dir / name).unlink(missing_ok=True)
        wanted = json.loads(json.dumps(identity))
        if config.exists():
            saved = _stored_config(config)
            if saved is None:
                raise LongswiftError(f"'{config}' is not a longswift bench config: use another --out-dir")
            stored = saved["identity"]
            if with_absolute_paths(stored) == wanted:  # (made when bench kept paths as typed: they are now absolute)
                stored = wanted
            if stored != wanted:
                diff = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
                raise LongswiftError(f"--out-dir '{out_dir}' holds results of a different configuration (differs in: "
                                     f"{', '.join(diff)}): use another --out-dir, or --fresh to discard them")
            # The identity names the model by its path; its fingerprint (config and embedding) tells another model
            # at that path apart. Kept beside the identity, so that directories made before it still resume (and
            # get it now).
            had = saved.get("model_fingerprint")
            if had is not None and fingerprint is not None and had != fingerprint:
                raise LongswiftError(f"--out-dir '{out_dir}' holds results of another model at the path "
                                     f"'{wanted.get('model')}' (its config or embedding differs): use another "
                                     "--out-dir, or --fresh to discard them")
            added = {"model_fingerprint": fingerprint} if had is None and fingerprint is not None else {}
            updated = {**saved, "identity": wanted, **added}
            if updated != saved:  # an older directory brought up to date, in one write
                write_atomic(config, json.dumps(updated, indent=1) + "\n")
        elif self.path.exists():
            raise LongswiftError(f"'{self.path}' exists without config.json: use another --out-dir or --fresh")
        else:
            kept = {"model_fingerprint": fingerprint} if fingerprint is not None else {}
            write_atomic(config, json.dumps({"identity": wanted, **kept}, indent=1) + "\n")
        if self.path.exists():
            self._load()
        self._file = open(self.path, "a", encoding="utf-8")

    def _load(self) -> None:
        text = self.path.read_text(encoding="utf-8")
        lines = text.splitlines()
        good = []
        for i, line in enumerate(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:  # a run cut off while its line was written: drop it, it reruns
                    write_atomic(self.path, "".join(g + "\n" for g in good))
                    return
                raise LongswiftError(f"{self.path}:{i + 1} is not JSON: fix or remove the line, or use --fresh") from None
            good.append(line)
            super().append(record)
        if text and not text.endswith("\n"):  # a whole last record without its newline: the next would join it
            write_atomic(self.path, "".join(g + "\n" for g in good))

    def append(self, record: dict[str, Any]) -> None:
        self.extend([record])

    def extend(self, records: list[dict[str, Any]]) -> None:
        """Add records with one write, flushed and fsynced: an interruption keeps all of them or none."""
        self._file.write("".join(json.dumps(r) + "\n" for r in records))
        self._file.flush()
        os.fsync(self._file.fileno())
        super().extend(records)

    def close(self) -> None:
        """Close results.jsonl and release the directory's lock."""
        if not self._file.closed:
            self._file.close()
        self._lock.release()


def _stored_config(config: Path) -> dict[str, Any] | None:
    """A bench directory's config.json (its "identity" an object); None if the file is not one."""
    try:
        kept = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return kept if isinstance(kept, dict) and isinstance(kept.get("identity"), dict) else None


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
    return (r["prompt"], r["prompt_tokens"], r["preset"], r["length"])


def row_id(r: dict[str, Any]) -> tuple[str, str]:
    return (r["method"], r["variant"])


def group(records: list[dict[str, Any]]) -> dict[tuple, dict[tuple[str, str], list[dict[str, Any]]]]:
    """cell -> (method, variant) -> runs, in the order first seen."""
    out: dict[tuple, dict[tuple[str, str], list[dict[str, Any]]]] = {}
    for r in records:
        out.setdefault(cell_id(r), {}).setdefault(row_id(r), []).append(r)
    return out


def median_rate(runs: list[dict[str, Any]]) -> float:
    return statistics.median(r["decode_tokens_per_second"] for r in runs)


def baseline(rows: dict[tuple[str, str], list[dict[str, Any]]], method: str) -> list[dict[str, Any]] | None:
    return next((runs for (m, _), runs in rows.items() if m == method), None)


def write_outputs(store: MemoryStore, ctx: RunContext, out_dir: Path | None, plots: bool) -> str:
    """(Re)write results.csv, the plots and report.md from every record; return the report."""
    records = store.records
    images: list[str] = []
    missing = None
    if out_dir is not None:
        write_atomic(out_dir / "results.csv", to_csv(records))
        if plots:
            from .plots import plot_all

            images = plot_all(records, out_dir)
            if records and importlib.util.find_spec("matplotlib") is None:  # said, not silently left out
                missing = "No plots: matplotlib is not installed (`pip install matplotlib`, then run again to add them)."
    report = render(records, ctx, images, missing)
    if out_dir is not None:
        write_atomic(out_dir / "report.md", report)
    return report


def to_csv(records: list[dict[str, Any]]) -> str:
    cells = group(records)
    rows = []
    for r in records:
        row = {k: v for k, v in r.items() if k not in CSV_SKIP}
        if isinstance(row.get("lockstep_with"), list):  # a list in one cell: the methods joined by '+'
            row["lockstep_with"] = "+".join(row["lockstep_with"])
        for base in ("ar", "hf"):
            runs = baseline(cells[cell_id(r)], base)
            row[f"speedup_vs_{base}"] = (round(speedup(r["decode_tokens_per_second"], median_rate(runs)), 4)
                                         if runs and r["decode_tokens_per_second"] > 0 and median_rate(runs) > 0
                                         else "")
        rows.append(row)
    buf = io.StringIO()
    if rows:
        fields = list(dict.fromkeys(k for row in rows for k in row))  # records of older versions may lack a field
        writer = csv.DictWriter(buf, fieldnames=fields, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


def software_versions() -> dict[str, str | None]:
    """The software a run is measured with: the libraries' versions and longswift's git commit (None
    where a library is not installed or the package is not in a git checkout)."""
    from .peers import version

    found: dict[str, str | None] = {name: version(mod) for name, mod in (
        ("torch", "torch"), ("transformers", "transformers"), ("llama-cpp-python", "llama_cpp"),
        ("longswift", "longswift"))}
    found["commit"] = _git_commit()
    return found


def _versions_text(versions: dict[str, str | None]) -> str:
    commit = versions.get("commit")
    return (", ".join(f"{k} {v or 'not installed'}" for k, v in versions.items() if k != "commit")
            + (f" (commit {commit})" if commit else ""))


def versions_lines(records: list[dict[str, Any]] | None, versions: dict[str, str | None] | None = None) -> list[str]:
    """The report's versions line(s): the software of this invocation (`versions`, default: found now), or,
    for a results directory whose runs were measured by several invocations, the software each group of
    runs was measured with (records kept from before bench recorded it are counted as such)."""
    now = _versions_text(versions or software_versions())
    if not records:
        return [f"- versions: {now}"]
    groups: dict[str, int] = {}
    for r in records:
        text = _versions_text(r["versions"]) if r.get("versions") else None
        groups[text or ""] = groups.get(text or "", 0) + 1
    if list(groups) == [now]:
        return [f"- versions: {now}"]
    lines = ["- versions the runs were measured with:"]
    lines += [f"  - {text or 'not recorded (runs measured before bench kept versions)'}: {n} run{'s' * (n != 1)}"
              for text, n in groups.items()]
    return lines + [f"  - this report was written with: {now}"]


def machine_lines(identity: dict[str, Any], records: list[dict[str, Any]] | None = None,
                  versions: dict[str, str | None] | None = None) -> list[str]:
    cpu = "unknown CPU"
    mem = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
        kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
        mem = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    every = identity.get("read_every")
    return [
        f"- machine: {platform.machine()} {cpu}, {os.cpu_count()} logical CPUs{mem}; {identity['threads']} torch threads; "
        f"python {platform.python_version()}",
        *versions_lines(records, versions),
        f"- model: {identity['model']}, {identity['dtype']} on {identity['device']}, packed linears: "
        f"{identity['packed_linears']}{' (q/k/v and gate/up colocated)' if identity.get('colocated_linears') else ''}"
        f"{', fused kernels (RMSNorm, residual adds, rope)' if identity.get('fused_kernels') else ''}"
        f"{', float32 logits' if identity.get('float32_logits') else ''}"
        f"{', graph attention ' + identity['graph_attention'] if identity.get('graph_attention') else ''}"
        f"{', rope scaling ' + identity['rope_scaling'] if identity.get('rope_scaling') else ''}"
        f"{', CUDA graphs off' if identity.get('cuda_graphs') is False else ''}"
        f"{f', AR reads its tokens {every} at a time (--read-every)' if every else ''}; "
        f"heads: {identity['heads']}",
    ]


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _drafted(runs: list[dict[str, Any]]) -> str:
    """' (D of S)': how many of a TokenSwift row's steps drafted (verified a trie; medians over runs),
    the sample its alpha comes from, of all its steps; '' for AR, peers and records made before bench
    kept these counts."""
    if any(r.get("verify_steps") is None or r.get("steps") is None for r in runs):
        return ""
    drafted = statistics.median(r["verify_steps"] for r in runs)
    return f" ({drafted:g} of {statistics.median(r['steps'] for r in runs):g})"


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
        if ident["dtype"] != "float64":
            lines.append(f"- tokenswift outputs equal ar's token for token in float64; in {ident['dtype']} the verify "
                         "pass's multi-token sums round differently (~1e-6 relative) from the decode step's, so a "
                         "draw within that rounding of a boundary between two tokens can go the other way (the "
                         "'first differs' lines below; rare in float32, common in bfloat16)")
    if any(m.startswith("llamacpp") for m in ctx.methods):
        lines.append("- llama.cpp runs its own kernels on the GGUF's stored weights (quantized types stay quantized), "
                     "while longswift and transformers run the weights dequantized to the dtype above: its speed is "
                     "that of a different numeric format and its tokens are not comparable with ours")
    for what, note in ctx.notes.items():
        lines.append(f"- sampler of {what}: {note}")
    for what, why in ctx.skipped.items():
        lines.append(f"- {what}: skipped ({why})")
    lines.append("- decode tok/s counts the tokens after the first arrival (the first token; AR's first block where "
                 "--read-every reads several at once, which prefill s then includes) over the time after it; "
                 "medians over runs; "
                 "peak memory is the resident set of the whole process during the run (CUDA: allocator peak), so it "
                 "includes every method loaded so far; the part in parentheses is what the run added on top")
    if ctx.identity.get("lockstep"):
        lines.append("- lockstep (--lockstep): our methods' runs of a cell and run ran together, a step at a time, the "
                     "one furthest behind in tokens next, each timed on its own clock, so that the machine's drift "
                     "hit them alike; the peak memory of runs made together is that of all of them at once")
    lines += ["", *[f"![{Path(i).stem}]({i})" for i in images], *([plots_note] if plots_note else [])]
    for cid, rows in group(records).items():
        lines += _cell_section(cid, rows)
    return "\n".join(lines) + "\n"


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


def _cell_section(cid: tuple, rows: dict[tuple[str, str], list[dict[str, Any]]]) -> list[str]:
    name, prompt_tokens, preset, length = cid
    ar, hf = baseline(rows, "ar"), baseline(rows, "hf")
    lines = ["", f"### {name}: {prompt_tokens}-token prompt, {length} new tokens, {preset} sampling", ""]
    if ar:
        same = []
        for (m, variant), runs in rows.items():
            if m == "ar":
                continue
            a, b = ar[0]["token_ids"], runs[0]["token_ids"]
            diverge = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            same.append(f"{_row_label(rows, m, variant)} {'identical' if diverge is None else f'first differs at new token {diverge}'}")
        if same:
            lines += [f"- outputs compared with ar (first run): {'; '.join(same)}", ""]
    alone = [f"{_row_label(rows, m, variant)} run {r['run'] + 1}" for (m, variant), runs in rows.items()
             for r in runs if r.get("lockstep_with") == []]
    if alone:
        lines += [f"- not in lockstep (no other method of ours was left to run with it in its cell and run): "
                  f"{', '.join(alone)}; its rate was measured alone", ""]
    apart = _invocations(rows)
    if apart:
        lines += [f"- measured by different invocations (1 = earliest): {apart}; a ratio between rows measured apart "
                  "compares different machine conditions (a new --out-dir measures them side by side)", ""]
    lines += ["| method | variant | runs | prefill s | decode tok/s | ms/token | vs ar | vs hf | alpha (steps drafted) | "
              "n-gram alpha | "
              "tokens/step | distinct-1/2/3/4 | peak MiB (+ added by the run) |", "|" + "---|" * 13]
    for (m, variant), runs in rows.items():
        rate = median_rate(runs)
        med = lambda k: statistics.median(r[k] for r in runs) if runs[0][k] is not None else None  # noqa: E731
        vs = [f"{speedup(rate, median_rate(b)):.2f}x" if b and rate > 0 and median_rate(b) > 0 else "-"
              for b in (ar, hf)]
        distinct = "/".join(f"{med(f'distinct_{n}'):.2f}" for n in (1, 2, 3, 4))
        timed = rate > 0  # 0: every token arrived in one block, no decode time to divide by
        lines.append(f"| {m} | {variant or '-'} | {len(runs)} | {med('prefill_seconds'):.2f} | "
                     f"{_fmt(rate if timed else None, '.1f')} | {_fmt(1e3 / rate if timed else None, '.1f')} | "
                     f"{vs[0]} | {vs[1]} | {_fmt(med('alpha'))}{_drafted(runs)} | "
                     f"{_fmt(med('ngram_alpha'))} | {_fmt(med('tokens_per_step'))} | {distinct} | "
                     f"{_memory(runs)} |")
    if ar and len(rows) > 1:
        lines += ["", "Speedup vs ar along the generation (decode time to the same token count, first run):", ""]
        header = [n for n, _ in ar[0]["checkpoints"]]
        lines += ["| method | " + " | ".join(str(n) for n in header) + " |", "|" + "---|" * (len(header) + 1)]
        for (m, variant), runs in rows.items():
            if m == "ar":
                continue
            curve = dict(curve_speedup(ar[0]["checkpoints"], runs[0]["checkpoints"], ar[0]["prefill_seconds"],
                                       runs[0]["prefill_seconds"]))
            cells = [next((f"{v:.2f}x" for n2, v in curve.items() if n2 >= n), "-") for n in header]
            lines.append(f"| {_row_label(rows, m, variant)} | " + " | ".join(cells) + " |")
    return lines
