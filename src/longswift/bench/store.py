"""Where bench keeps its runs: in memory, or in a resumable results directory (results.jsonl under a lock,
its config.json naming what was measured, so that a changed configuration is refused rather than mixed)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..atomic import OutputLock, make_dirs, remove_stale_files, write_atomic
from ..errors import LongswiftError
from ..runtime.probe import same_model

# What every run's record has, which the report groups and resumes by (older versions' records included).
RECORD_FIELDS = frozenset({"key", "prompt", "prompt_tokens", "preset", "length", "method", "variant", "run",
                           "decode_tokens_per_second", "token_ids"})
# What the report reads of every record, and its type: `int` a whole number, `float` any number.
RECORD_TYPES: dict[str, type] = {
    "key": str, "prompt": str, "preset": str, "method": str, "variant": str, "finished_at": str,
    "prompt_tokens": int, "length": int, "run": int, "peak_memory_bytes": int,
    "decode_tokens_per_second": float, "decode_seconds": float, "prefill_seconds": float,
    **{f"distinct_{n}": float for n in (1, 2, 3, 4)}, "sampling": dict, "token_ids": list, "checkpoints": list,
}


def _holds_runs(out_dir: Path) -> bool:
    """Whether a results directory holds any run's record (a grid stopped during its first run holds none)."""
    try:
        return bool((out_dir / "results.jsonl").read_bytes().strip())
    except FileNotFoundError:
        return False


def record_problem(record: dict[str, Any]) -> str | None:
    """What in a results record the report cannot read (a field missing or of another type, token ids that are not
    whole numbers, checkpoints that are not [tokens, seconds] pairs), or None."""
    def number(v: Any, kind: type) -> bool:
        return not isinstance(v, bool) and isinstance(v, int if kind is int else (int, float))

    for name, kind in RECORD_TYPES.items():
        if name not in record:
            return f"it has no '{name}'"
        value = record[name]
        if not (number(value, kind) if kind in (int, float) else isinstance(value, kind)):
            return f"its '{name}' is {value!r}, not {_KINDS[kind]}"
    if not all(number(t, int) for t in record["token_ids"]):
        return "its 'token_ids' are not all whole numbers"
    if not all(isinstance(c, list) and len(c) == 2 and number(c[0], int) and number(c[1], float)
               for c in record["checkpoints"]):
        return "its 'checkpoints' are not all [tokens, seconds] pairs"
    return None


_KINDS = {str: "text", int: "a whole number", float: "a number", dict: "an object", list: "a list"}
# What a results directory holds (all of it bench's: --fresh discards these, and outputs may not replace them).
OUTPUT_FILES = ("results.jsonl", "results.csv", "report.md", "config.json", "speedup_vs_length.png",
                "alpha_vs_length.png", "time_to_n_tokens.png")


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
                 model_fingerprint: str | None = None, on_stale: Callable[[Path], None] | None = None,
                 model_probe: tuple[list[float], Any] | None = None) -> None:
        """`model_probe`: the model's probe (runtime.probe) and its dtype, kept beside the identity and
        compared up to rounding on a resume."""
        super().__init__(identity)
        if out_dir.exists() and not out_dir.is_dir():
            raise LongswiftError(f"--out-dir '{out_dir}' is a file: give a directory")
        try:
            make_dirs(out_dir)
        except OSError as exc:
            raise LongswiftError(f"cannot create --out-dir '{out_dir}': {exc.strerror}") from None
        self.path = out_dir / "results.jsonl"
        config = out_dir / "config.json"
        # One invocation at a time: two writing one directory ran every run twice (the report took medians over
        # the copies). Held until close().
        self._lock = OutputLock([("--out-dir", self.path)], on_stale)  # (`on_stale` hears of a killed run's files)
        self._lock.__enter__()
        try:  # the lock covers the directory's other files, whose temporary copies a killed run left too
            for name in OUTPUT_FILES:
                remove_stale_files(out_dir / name, on_stale)
            self._open(out_dir, config, identity, fresh, model_fingerprint, model_probe)
        except BaseException:
            self._lock.release()
            raise

    def _open(self, out_dir: Path, config: Path, identity: dict[str, Any], fresh: bool,
              fingerprint: str | None, probe: tuple[list[float], Any] | None) -> None:
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
            if "processor" not in stored and "processor" in wanted:  # made before the identity kept it: it gets it
                stored = {**stored, "processor": wanted["processor"]}
            if with_absolute_paths(stored) == wanted:  # (made when bench kept paths as typed: they are now absolute)
                stored = wanted
            if stored != wanted and not _holds_runs(out_dir):  # stopped before its first run: nothing to keep
                for name in OUTPUT_FILES:
                    (out_dir / name).unlink(missing_ok=True)
                return self._open(out_dir, config, identity, False, fingerprint, probe)
            if stored != wanted:
                diff = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
                raise LongswiftError(f"--out-dir '{out_dir}' holds results of a different configuration (differs in: "
                                     f"{', '.join(diff)}): use another --out-dir, or --fresh to discard them")
            # The identity names the model by its path; its fingerprint (config and embedding) tells another model
            # at that path apart. Kept beside the identity, so that directories made before it still resume (and
            # get it now).
            # The fingerprint misses a fine-tune that kept its base's embeddings, which the probe (its answer to
            # a fixed input, equal up to rounding) tells apart; kept the same way.
            had, had_probe = saved.get("model_fingerprint"), saved.get("model_probe")
            if (had is not None and fingerprint is not None and had != fingerprint) or \
                    (had_probe is not None and probe is not None and not same_model(had_probe, *probe)):
                raise LongswiftError(f"--out-dir '{out_dir}' holds results of another model at the path "
                                     f"'{wanted.get('model')}' (its config or weights differ): use another "
                                     "--out-dir, or --fresh to discard them")
            added = {**({"model_fingerprint": fingerprint} if had is None and fingerprint is not None else {}),
                     **({"model_probe": probe[0]} if had_probe is None and probe is not None else {})}
            updated = {**saved, "identity": wanted, **added}
            if updated != saved:  # an older directory brought up to date, in one write
                write_atomic(config, json.dumps(updated, indent=1) + "\n")
        elif existing := [name for name in OUTPUT_FILES if (out_dir / name).exists()]:  # not bench's: not replaced
            raise LongswiftError(f"--out-dir '{out_dir}' holds {', '.join(existing)} without bench's config.json: "
                                 "use another --out-dir, or --fresh to discard them")
        else:
            kept = {**({"model_fingerprint": fingerprint} if fingerprint is not None else {}),
                    **({"model_probe": probe[0]} if probe is not None else {})}
            write_atomic(config, json.dumps({"identity": wanted, **kept}, indent=1) + "\n")
        if self.path.exists():
            self._load()
        self._file = open(self.path, "ab", buffering=0)  # unbuffered: a failed write is not written again at close

    def _load(self) -> None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            at = self.path.read_bytes()[:exc.start].count(b"\n") + 1
            raise LongswiftError(f"{self.path}:{at} is not UTF-8 text: fix or remove the line, or use --fresh") from None
        lines = text.split("\n")  # (JSON escapes the separators splitlines() also breaks at)
        if lines and not lines[-1]:
            lines.pop()
        good: list[str] = []
        for i, line in enumerate(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:  # a run cut off while its line was written: drop it, it reruns
                    write_atomic(self.path, "".join(g + "\n" for g in good))
                    return
                raise LongswiftError(f"{self.path}:{i + 1} is not JSON: fix or remove the line, or use --fresh") from None
            if not isinstance(record, dict) or not RECORD_FIELDS <= record.keys():
                raise LongswiftError(f"{self.path}:{i + 1} is not a bench run's record (a JSON object with "
                                     f"{', '.join(sorted(RECORD_FIELDS))}): fix or remove the line, or use --fresh")
            wrong = record_problem(record)
            if wrong:  # (what the report reads: a field missing or of another type was its traceback)
                raise LongswiftError(f"{self.path}:{i + 1} is a damaged bench record ({wrong}): fix or remove the "
                                     "line, or use --fresh")
            if self.has(record["key"]):  # (bench writes each run once: a file merged by hand counted it twice)
                raise LongswiftError(f"{self.path}:{i + 1} repeats the run of an earlier line (key {record['key']}): "
                                     "remove one of them, or use --fresh")
            good.append(line)
            super().append(record)
        if text and not text.endswith("\n"):  # a whole last record without its newline: the next would join it
            write_atomic(self.path, "".join(g + "\n" for g in good))

    def append(self, record: dict[str, Any]) -> None:
        self.extend([record])

    def extend(self, records: list[dict[str, Any]]) -> None:
        """Add records with one write, fsynced: an interruption keeps all of them or none, and a write that fails
        (a full disk) is cut back off the file, which keeps the runs finished before it."""
        fd = self._file.fileno()
        start = os.fstat(fd).st_size
        data = memoryview("".join(json.dumps(r) + "\n" for r in records).encode())
        try:
            while data:
                data = data[self._file.write(data):]
            os.fsync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, start)
            except OSError:  # (a record cut off at the end is dropped when the directory is next read)
                pass
            raise LongswiftError(f"cannot write '{self.path}': {exc.strerror or exc}; the runs finished before are "
                                 "kept: free some space and rerun the command to resume") from None
        super().extend(records)

    def close(self) -> None:
        """Close results.jsonl and release the directory's lock (also when closing fails)."""
        try:
            if not self._file.closed:
                self._file.close()
        finally:
            self._lock.release()


def _stored_config(config: Path) -> dict[str, Any] | None:
    """A bench directory's config.json (its "identity" an object); None if the file is not one."""
    try:
        kept = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return kept if isinstance(kept, dict) and isinstance(kept.get("identity"), dict) else None
