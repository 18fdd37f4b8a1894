"""Where a `longswift generate` run writes and how it ends: the outputs (text, JSON, checkpoint), the loop
that streams tokens into them, and a stop by signal, a closed pipe or an error: the outputs appear together
or not at all, the state is saved, and one line says how to continue."""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import LongswiftError, LostContact, cli_text
from .display import summary_line
from .stop import READING, SAVING, WRITING, StopRequest, say


@dataclass
class Outputs:
    """Where this run writes: text file (or stdout), JSON result, checkpoint; all absolute paths."""

    output: Path | None
    json: Path | None
    checkpoint: Path | None
    every: int

    def fallback_checkpoint(self) -> Path:
        """Where an interrupted run without --checkpoint saves its state (on stdout alone, the first free
        name from there on: see save_interrupted)."""
        base = self.output or self.json
        return base.with_name(base.name + ".checkpoint.json") if base else Path("longswift.checkpoint.json").absolute()

    def save_interrupted(self, ckpt: Any) -> Path:
        """Save an interrupted run's checkpoint; return where. A run on stdout alone has no file of its
        own to put it beside: it takes the first of ./longswift.checkpoint.json, .2.json, ... that no
        other run holds or has written, so it never replaces another run's state."""
        from ..atomic import OutputLock

        if self.checkpoint or self.output or self.json:
            path = self.checkpoint or self.fallback_checkpoint()
            ckpt.save(path)
            return path
        first = self.fallback_checkpoint()
        for n in range(1, 10_000):
            path = first if n == 1 else first.with_name(f"longswift.checkpoint.{n}.json")
            lock = OutputLock([("--checkpoint", path)])
            try:
                lock.__enter__()
            except LongswiftError:  # another run is saving there right now
                continue
            try:
                if not path.exists():
                    ckpt.save(path)
                    return path
            finally:
                lock.release()
        raise LongswiftError(f"no free checkpoint name next to '{first}': give --checkpoint FILE")

    def saved(self) -> dict[str, str | int | None]:
        """What a checkpoint records, so that --resume writes the same files from any directory, and saves
        as often; and where the checkpoint itself goes, so that a resume of a copy of the job's directory
        writes the copy's outputs, not the original's (a run on stdout alone has none to follow it)."""
        at = self.checkpoint or (self.fallback_checkpoint() if self.output or self.json else None)
        return {"output": str(self.output) if self.output else None, "json": str(self.json) if self.json else None,
                "checkpoint_every": self.every, "checkpoint": str(at) if at else None}

    def locked(self) -> Any:
        """The lock on every file this run may write, the checkpoint an interrupt saves next to --output/--json
        too: unlocked, another run given it as its --checkpoint had its state replaced by this one's. (Giving
        this run a --checkpoint of its own is the way past that lock: so it is named.)"""
        from ..atomic import OutputLock

        fallback = self.fallback_checkpoint() if self.checkpoint is None and (self.output or self.json) else None
        return OutputLock([(flag, p) for flag, p in (("--output", self.output), ("--json", self.json),
                                                     ("--checkpoint", self.checkpoint or fallback)) if p is not None],
                          note_stale)


def write_run(engine: Any, stream: Any, out: Outputs, stop: StopRequest, no_progress: bool,
              last_saved: tuple[Path, int] | None = None) -> int:
    """Stream the run into its outputs and end it as the way it stopped asks; the exit status. `last_saved`:
    the checkpoint a resumed run started from, and its tokens (named if the run fails)."""
    from ..atomic import AtomicFile
    from ..detok import IncrementalDecoder
    from .display import PlainDisplay, make_display

    tp = engine.tp
    if tp is not None and tp.rank != 0:
        return _follow(stream, stop, tp)
    saved = out.saved()
    text_file = AtomicFile(out.output) if out.output else None
    json_file: AtomicFile | None = None
    path: Path | None = None  # where an interrupted run's state went; None with `unsaved`, why it could not
    unsaved: Exception | None = None
    echoed = False  # a resumed run's earlier text is on stdout
    try:
        decoder = IncrementalDecoder(engine.tokenizer) if engine.tokenizer is not None else None
        push = decoder.push if decoder else _ids_as_text()  # no tokenizer: the ids
        earlier = push(list(stream.token_ids)) if stream.token_ids else ""
        stats = stream.stats
        total = stream.max_new_tokens
        display = make_display(text_file, total, len(stream.token_ids), progress=not no_progress)
        # A long context (a resume's re-read) takes minutes on a CPU: shown as it is read, and a stop ends the
        # reading (under tensor parallelism every rank reads on: they stop together after the first step).
        stream.on_prefill = display.prefill if tp is not None else _stop_reading(display.prefill, stop)
        if tp is None:
            stop.doing = READING
            if stop.signum is not None:  # stopped while the model loaded: nothing generated, nothing to write
                raise StoppedReading
        next_save = len(stream.token_ids) + out.every
        with display:
            display.text(earlier)  # a resumed run's file holds the whole text
            # (a terminal's display ends its last line itself)
            echoed = bool(earlier) and isinstance(display, PlainDisplay) and not text_file
            for ids in stream:
                stop.doing = SAVING
                display.text(push(ids))
                display.advance(len(ids), stats)
                if out.checkpoint and len(stream.token_ids) >= next_save:
                    try:
                        stream.checkpoint(saved).save(out.checkpoint)
                    except LongswiftError as exc:  # the checks the start passed, failed since (a directory made
                        raise OSError(cli_text(exc)) from exc  # read-only): the system's doing, status 1
                    last_saved = (out.checkpoint, len(stream.token_ids))
                    next_save = len(stream.token_ids) + out.every
                stopping = stop.signum is not None
                if tp is not None:  # every rank stops after the same step, at a signal any of them got
                    agreed = tp.max_int(stop.signum or 0)
                    if agreed and stop.signum is None:  # (only another process got it: a kill of its pid)
                        stop.signum = agreed
                        say(f"\nlongswift: {signal.Signals(agreed).name} received by another process of this run: "
                            f"{SAVING}")
                    stopping = bool(agreed)
                if stopping:
                    stop.signum = stop.signum or signal.SIGTERM
                    if not stream.complete():  # (one that is ends at the next iteration, which runs no step)
                        break
            if decoder:
                display.text(decoder.flush())
            if not text_file:
                display.text("\n")
        interrupted = stop.signum is not None and stream.result is None
        result = stream.result_so_far(finish_reason="interrupted") if interrupted else stream.result
        # Bounded work that a second signal waits for: it discarded a finished run's staged outputs (or left one
        # output renamed and not the other), so that a run without a periodic checkpoint kept nothing.
        with stop.held():
            if not interrupted:
                stop.doing = WRITING
            # All that can fail on a full disk comes before the first rename: the outputs appear together or not
            # at all.
            try:
                if text_file:
                    text_file.stage()
                if out.json:
                    json_file = AtomicFile(out.json)
                    json_file.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
                    json_file.stage()
            except (OSError, LongswiftError) as exc:
                if not interrupted:
                    raise
                # an interrupted run's state is still saved (it was lost with them: the --json's directory removed
                # during the run, a full disk under the outputs but not the checkpoint); neither output is written
                _discard(text_file, json_file)
                text_file = json_file = None
                say(f"longswift: the outputs could not be written ({cli_text(exc)}); "
                    "the saved state holds every token, and resuming it writes them")
            if interrupted:
                try:
                    path = out.save_interrupted(stream.checkpoint(saved))
                    last_saved = (path, len(stream.token_ids))
                except (OSError, LongswiftError) as exc:  # (warned at the start where foreseen): the text still lands,
                    path, unsaved = None, exc  # unless a checkpoint saved earlier is intact: outputs newer than it
                    if last_saved is not None:  # would stop its resume (which replaces no file written after it)
                        _discard(text_file, json_file)
                        text_file = json_file = None
            elif out.checkpoint:  # the final state: resuming it reproduces the finished outputs
                try:
                    stream.checkpoint(saved).save(out.checkpoint)
                except (OSError, LongswiftError) as exc:
                    if last_saved is not None:  # outputs newer than that checkpoint would stop its resume
                        raise
                    _commit(text_file, json_file)  # nothing else holds the run: its outputs are kept
                    said = ("the run finished and its outputs were written, but its checkpoint could not be saved "
                            f"to '{shown(out.checkpoint)}'")
                    if isinstance(exc, OSError):  # (a system error: status 1, as the others)
                        raise os_error_with(exc, said) from exc
                    raise LongswiftError(f"{said} ({cli_text(exc)})") from exc
                last_saved = (out.checkpoint, len(stream.token_ids))
            _commit(text_file, json_file)
    except BaseException as exc:
        _discard(text_file, json_file)
        return _failed(exc, out, stream, saved, stop, last_saved, echoed)
    say(summary_line(result.stats))  # (best effort from here: after a hangup nobody reads stderr)
    return _ended(stream, stop, total, interrupted, path, unsaved, last_saved)


def _commit(*files: Any) -> None:
    """Rename each staged output (an AtomicFile, or None where there is none) into place."""
    for f in files:
        if f:
            f.commit()


def _discard(*files: Any) -> None:
    """Drop each output's temporary file (an AtomicFile, or None), best effort."""
    for f in files:
        if f:
            f.discard()


def _follow(stream: Any, stop: StopRequest, tp: Any) -> int:
    """A tensor-parallel rank other than 0: the same steps, the same stop decisions and exit status, no output."""
    for _ in stream:
        signum = tp.max_int(stop.signum or 0)  # a signal any rank got (to all of them: the same one), or 0
        if signum:
            stop.signum = stop.signum or signum
            if not stream.complete():  # (one that is ends at the next iteration, as on rank 0: status 0)
                return stop.exit_code
    return 0


def _failed(exc: BaseException, out: Outputs, stream: Any, saved: Any, stop: StopRequest,
            last_saved: tuple[Path, int] | None, echoed: bool = False) -> int:
    """What a run that raised `exc` (its outputs discarded) does: its exit status where it ends here (stopped while
    reading, its output closed under a signal), else `exc` again, with where to resume from where a state is saved.
    `echoed`: a resumed run's earlier text went to stdout (stopped while reading, it gets its closing newline)."""
    if isinstance(exc, StoppedReading):
        if echoed:
            try:
                sys.stdout.write("\n")
                sys.stdout.flush()
            except OSError:
                pass
        nothing = "no file written (the text shown is the checkpoint's)" if echoed else "nothing written"
        say(f"longswift: stopped before the first new token: {nothing}"
            + (f"; {_resume_hint(*last_saved)}" if last_saved is not None else ""))
        return stop.exit_code
    if _output_lost(exc) and (stop.signum is not None or out.checkpoint):
        # The terminal or pipe the run wrote to is gone (Ctrl-C also stopped `| tee`; a hangup): the run
        # itself is fine, between two steps, and its state is saved as an interrupted run's would be.
        path = _save_quietly(out, stream, saved)
        if path is not None:
            where = shown(path)
            say(f"longswift: output closed at {len(stream.token_ids)} of {stream.max_new_tokens} tokens; state "
                f"saved to '{where}'. Continue with: longswift generate --resume {shell_word(where)}")
        if stop.signum is not None:
            return stop.exit_code
    if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError) and last_saved is not None:
        raise _with_resume_hint(exc, *last_saved) from exc
    if isinstance(exc, LostContact) and len(stream.token_ids) > (last_saved[1] if last_saved else 0):
        # Another process of a tensor-parallel run died (an OOM kill, a failed GPU): this one holds the tokens
        # and the generator's state of the last whole step (stream.checkpoint), saved as an interrupted run's.
        path = _save_quietly(out, stream, saved)
        if path is not None:
            raise LongswiftError(f"{exc}; {_state_saved(stream, path)}") from exc
    if (isinstance(exc, Exception) and not isinstance(exc, (LongswiftError, OSError))
            and getattr(stream, "failed_in_step", False) and stream.token_ids):
        # An error inside a step (out of GPU memory on a shared device, a kernel's failure): the stream holds the
        # tokens and generator state from before that step, saved as an interrupted run's; a traceback lost them
        path = _save_quietly(out, stream, saved)
        if path is not None:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise LongswiftError(f"{type(exc).__name__}{': ' + first if first else ''} (--debug shows where); "
                                 f"{_state_saved(stream, path, ' before that step')}") from exc
    if isinstance(exc, LongswiftError) and last_saved is not None:  # e.g. another process of the run failed
        raise LongswiftError(f"{cli_text(exc)}; {_resume_hint(*last_saved)}") from exc
    if type(exc) is KeyboardInterrupt and last_saved is not None:  # a second Ctrl-C: stopped at once
        raise KeyboardInterrupt(_resume_hint(*last_saved)) from exc
    raise exc


def _ended(stream: Any, stop: StopRequest, total: int, interrupted: bool, path: Path | None,
           unsaved: Exception | None, last_saved: tuple[Path, int] | None) -> int:
    """What a run that ended (finished, or interrupted with its state saved to `path` or not, `unsaved` saying why)
    says on stderr after its summary, and its exit status."""
    if interrupted:
        if path is None and last_saved is not None:
            say(f"longswift: interrupted at {len(stream.token_ids)} of {total} tokens; its state could not be saved "
                f"({unsaved}), so its outputs were not written either; {_resume_hint(*last_saved)}")
            return stop.exit_code
        if path is None:
            say(f"longswift: interrupted at {len(stream.token_ids)} of {total} tokens; its state could not be saved "
                f"({unsaved}): give --checkpoint FILE in a writable directory to make a run resumable")
            return stop.exit_code
        where = shown(path)
        say(f"longswift: interrupted at {len(stream.token_ids)} of {total} tokens; state saved to '{where}'. "
            f"Continue with: longswift generate --resume {shell_word(where)}")
        return stop.exit_code
    if stop.deferred:  # a second signal while the finished run wrote its outputs, which it waited for
        say("longswift: interrupted after the finished run's outputs were written in full")
        return stop.exit_code
    return 0


def _ids_as_text() -> Callable[[list[int]], str]:
    """The text of a model without a tokenizer: its ids, a space between two (none before the first)."""
    started = False

    def push(ids: list[int]) -> str:
        nonlocal started
        if not ids:
            return ""
        text = (" " if started else "") + " ".join(map(str, ids))
        started = True
        return text

    return push


class StoppedReading(Exception):
    """A stop signal came before the first new token (while the model loaded or the context was read):
    the run ends there, writing nothing (a resumed run's checkpoint stays as it was)."""


def _stop_reading(show: Callable[[int, int], None], stop: StopRequest) -> Callable[[int, int], None]:
    """The stream's on_prefill: show the reading, and end it at the next chunk once a stop is asked for
    (a long context takes minutes to read: a run that has generated nothing saves nothing)."""

    def reading(read: int, total: int) -> None:
        show(read, total)
        if stop.signum is not None:
            raise StoppedReading

    return reading


def _output_lost(exc: BaseException) -> bool:
    """Whether `exc` says the run's terminal or pipe is gone: its reader stopped (EPIPE), or the terminal
    hung up (EIO)."""
    return isinstance(exc, BrokenPipeError) or (isinstance(exc, OSError) and exc.errno == errno.EIO)


def _save_quietly(out: Outputs, stream: Any, saved: dict[str, Any]) -> Path | None:
    """Save a run whose output was lost as an interrupted one, where an interrupted run saves; None if it
    cannot (a failed save must not hide why the run stopped)."""
    try:
        return out.save_interrupted(stream.checkpoint(saved))
    except (OSError, LongswiftError):
        return None


def _state_saved(stream: Any, path: Path, when: str = "") -> str:
    """What a run that failed says of the state it saved to `path` as it failed: its tokens and the command that
    continues from it."""
    where = shown(path)
    return (f"state{when} saved at {len(stream.token_ids)} of {stream.max_new_tokens} tokens to '{where}': continue "
            f"with: longswift generate --resume {shell_word(where)}")


def _resume_hint(path: Path, tokens: int) -> str:
    """What a run stopped before its end says of the checkpoint it saved last: intact, and the command
    that continues from it."""
    return (f"the checkpoint saved at {tokens} tokens is intact: continue with: longswift generate --resume "
            f"{shell_word(shown(path))}")


def _with_resume_hint(exc: OSError, path: Path, tokens: int) -> OSError:
    """A system error (a full disk) that stopped a run, with on the same line the checkpoint that is
    intact and the command that continues from it."""
    return os_error_with(exc, _resume_hint(path, tokens))


def os_error_with(exc: OSError, hint: str) -> OSError:
    """The system error `exc` (its reason and file: a rename's target) with `hint` after it on the same line."""
    if exc.errno is None or exc.strerror is None:
        return OSError(f"{exc}; {hint}")
    named = exc.filename2 if exc.filename2 is not None else exc.filename  # (a rename's target, not its '.partial')
    where = f": '{named}'" if named is not None else ""
    return OSError(exc.errno, f"{exc.strerror}{where}; {hint}")


def note_stale(stale: Path) -> None:
    """Say that a temporary file or directory a killed run left was removed (see atomic.OutputLock)."""
    print(f"longswift: removed '{shown(stale)}', left by a run that was killed while writing it", file=sys.stderr)


def shell_word(text: str) -> str:
    """`text` (a path) quoted so that a shell gives it back as it is: a name that is not UTF-8 (held as
    surrogates, printed as '\\udcff') is spelt in bash's $'...' with each such byte as \\xNN."""
    raw = os.fsencode(text)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "$'" + "".join(chr(b) if 32 <= b < 127 and b not in b"'\\" else f"\\x{b:02x}" for b in raw) + "'"
    return shlex.quote(text)


def shown(path: Path) -> str:
    """A path as short as it can be said from here (relative below the current directory)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
