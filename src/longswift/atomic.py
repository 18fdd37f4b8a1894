"""Files that are either complete or absent: write to a temporary sibling of a name no other
writer uses, fsync, rename. `OutputLock` keeps two runs from writing the same file at once."""

from __future__ import annotations

import errno
import glob
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from .errors import LongswiftError

try:
    import fcntl
except ImportError:  # not on Windows: locking is skipped there
    fcntl = None  # type: ignore[assignment]


# Where a path names a terminal, a pipe or a process's descriptor, not a file: /dev/stdout is a link to
# /proc/self/fd/1, and a new file renamed over it would replace the link (as root) instead of writing to it.
_STREAMS = ("/dev/", "/proc/")


def output_target(path: str | os.PathLike) -> Path:
    """The file that writing `path` replaces: a symbolic link's target, so that the link is kept and
    its target written, as a plain open() writes through it (renaming over the link would replace the
    link). Refused where the path or its target is a device or a process's file descriptor."""
    p = Path(path).expanduser()
    if not p.is_symlink():
        return p
    real = Path(os.path.realpath(p))
    hops, q = [p.absolute(), real], p.absolute()
    while q.is_symlink() and len(hops) < 42:  # each link on the way (/dev/stdout -> /proc/self/fd/1 -> a file)
        q = Path(os.path.normpath(q.parent / os.readlink(q)))
        hops.append(q)
    if q.is_symlink():  # (realpath gives a loop's own name, and the rename replaced the link: open() says ELOOP)
        raise LongswiftError(f"output path '{p}' is a loop of symbolic links (or a chain of over 40): give a file name")
    if any(str(q).startswith(_STREAMS) for q in hops):
        raise LongswiftError(f"output path '{p}' leads to a stream or device ('{real}'): longswift writes each "
                             "file whole and renames it into place, so give a file name")
    return real


def _refuse_dash(path: str | os.PathLike, what: str, flag: str | None = None) -> None:
    """'-' means stdout to a shell user; as an output path it would name a file (or directory) '-'."""
    if str(path) == "-":
        raise LongswiftError(f"{flag or 'output path'} '-' would write {what} named '-': longswift writes its outputs "
                             f"to named files (each whole, renamed into place), not to stdout; give a {what[2:]} name")


def check_writable(path: str | os.PathLike, flag: str | None = None) -> Path:
    """Fail early (before a long run) if `path` cannot be created; returns the path to write (a link's
    target, see output_target). `flag`: the option that named it, for the refusals that can say so."""
    _refuse_dash(path, "a file", flag)
    try:
        p = output_target(path)
    except OSError as exc:  # (the link check's lstat: a name too long for the file system)
        if exc.errno == errno.ENAMETOOLONG:
            raise _too_long(Path(path)) from None
        raise
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise LongswiftError(f"output path '{p}' is a directory: give a file name")
    if p.exists() and not p.is_file():
        # Written by renaming a new file over it, a device or pipe would be replaced, not written to.
        raise LongswiftError(f"output path '{p}' is not a regular file (a device, pipe or socket): give a file name")
    if not parent.is_dir():
        raise LongswiftError(f"cannot write '{p}': directory '{parent}' does not exist")
    if not os.access(parent, os.W_OK):
        raise LongswiftError(f"cannot write '{p}': directory '{parent}' is not writable")
    try:  # what access() cannot see: a read-only or special file system, or root's view of one
        fd, probe = tempfile.mkstemp(prefix=p.name + ".", suffix=".probe", dir=parent)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise _too_long(p) from None
        raise LongswiftError(f"cannot write '{p}': cannot create a file in '{parent}' ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)
    if p.is_file():
        mine, owner = os.geteuid(), p.stat().st_uid
        # Written by renaming a new file over it, a read-only file would be replaced regardless (root: no write bit)
        if not os.access(p, os.W_OK) or not p.stat().st_mode & 0o222:
            if owner != mine:
                raise LongswiftError(f"output file '{p}' is another user's and read-only to this one: give another "
                                     "file name")
            raise LongswiftError(f"output file '{p}' is read-only: make it writable (chmod u+w) or give another file "
                                 "name")
        # In a sticky directory (/tmp, a shared scratch) only a file's owner, the directory's or root may replace
        # it: the rename at the run's end failed there, after the whole run, and its output was lost.
        if parent.stat().st_mode & stat.S_ISVTX and mine not in (0, owner, parent.stat().st_uid):
            raise LongswiftError(f"output file '{p}' is another user's, in a directory where only a file's owner may "
                                 "replace it (sticky, as /tmp is): give another file name")
    return p


def _too_long(p: Path) -> LongswiftError:
    return LongswiftError(f"cannot write '{p}': its name is too long for this file system once a temporary suffix is "
                          "added ('.<random>.partial' while writing): choose a shorter name")


def check_json_output(path: Path, flag: str) -> None:
    """Refuse a JSON output (--json, --checkpoint) whose path holds a file that is not JSON (a heads file named by
    mistake: replacing it would lose hours of training); an empty file or a JSON one is replaced as usual."""
    try:  # (expanded as the write expands it: '--json=~/h.safetensors' reaches here as typed, and was not checked)
        with open(Path(path).expanduser(), "rb") as f:
            head = f.read(64).removeprefix(b"\xef\xbb\xbf").lstrip()  # (an editor's byte order mark: still JSON)
    except (FileNotFoundError, IsADirectoryError):
        return
    except OSError:  # unreadable: check_writable says what it can
        return
    if head and head[:1] not in (b"{", b"["):
        raise LongswiftError(f"{flag} '{path}' exists and is not a JSON file, which {flag} would replace: choose "
                             "another file name")


def check_appendable(path: Path, flag: str) -> None:
    """Refuse an output that a report is appended to (append_atomic) whose path holds a file that is not UTF-8 text
    (a UTF-16 notes file, a binary): its runs would all go by before the append failed."""
    try:
        _text_to_append_to(output_target(path), flag)  # the file append_atomic reads (a tilde expanded)
    except OSError:  # unreadable, or a directory: check_writable says what it can
        return


def _json_like(text: str) -> bool:
    """Whether `text` is a JSON document, or JSON lines, of objects or arrays (a markdown file may begin with '['
    too: a link reference is no JSON)."""
    import json

    first = text.lstrip().split("\n", 1)[0]
    for candidate in (text, first):
        try:
            if isinstance(json.loads(candidate), (dict, list)):
                return True
        except (ValueError, RecursionError):
            pass
    return False


def _text_to_append_to(path: Path, flag: str) -> str:
    """The text of the file a report is appended to ("" where there is none yet), refused where it is not UTF-8."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return ""
    except UnicodeDecodeError:
        raise LongswiftError(f"{flag} '{path}' exists and is not UTF-8 text, and the report is appended to it: choose "
                             "another file name") from None
    if "\0" in text or _json_like(text):  # (a --json result named by mistake: markdown would break it)
        raise LongswiftError(f"{flag} '{path}' exists and holds JSON or binary data, and the markdown report is "
                             "appended to it: choose another file name")
    return text


# The flags of files a command reads (check_distinct's files that have no lock file: they are not written).
INPUT_FLAGS = frozenset({"--prompt-file", "--model", "--heads", "--data"})


def check_distinct(files: Iterable[tuple[str, str | os.PathLike | None]]) -> None:
    """Refuse two of a command's files (named by their flags; None: not given) that are one file, or a file named
    as an output's lock file (lock_path): of two outputs only the one written last would be left, an output would
    overwrite an input, and a file named as an output's lock was removed with the lock at the run's end."""
    seen: dict[Path, str] = {}
    locks: dict[Path, tuple[str, str | os.PathLike]] = {}
    for flag, p in files:
        if p is None:
            continue
        given = Path(p).expanduser()
        real = Path(os.path.realpath(given))
        if real in seen:
            raise LongswiftError(f"{seen[real]} and {flag} are the same file ('{p}'): give each its own path")
        seen[real] = flag
        if flag not in INPUT_FLAGS:
            locks[lock_path(Path(os.path.realpath(given.parent)) / given.name)] = (flag, p)
    for real, flag in seen.items():
        if real in locks:
            owner, p = locks[real]
            raise LongswiftError(f"{flag} '{real.name}' is the name of the lock file that {owner} '{p}' is written "
                                 "under: give it another name")


def check_dir_writable(path: str | os.PathLike, flag: str) -> Path:
    """Fail early if `path` cannot be a directory that takes new entries: an existing directory is
    probed itself, an absent one where it would be created (its nearest existing ancestor)."""
    _refuse_dash(path, "a directory", flag)
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise LongswiftError(f"{flag} '{p}' is a file: give a directory")
    where = p if p.exists() else next(a for a in p.absolute().parents if a.exists())
    if not where.is_dir():
        raise LongswiftError(f"cannot create {flag} '{p}': '{where}' is not a directory")
    try:  # access() is not enough: a read-only or special file system, or root's view of one
        probe = tempfile.mkdtemp(prefix=".longswift-", suffix=".probe", dir=where)
    except OSError as exc:
        raise LongswiftError(f"cannot write {flag} '{p}': cannot create entries in '{where}' ({exc.strerror})") from None
    os.rmdir(probe)
    return p


def check_new_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Fail early if `path` cannot become a new directory: absent, or an empty directory, that takes entries."""
    _refuse_dash(path, "a directory", flag)
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        kind = "a file" if p.is_file() else "a device, pipe or socket"
        raise LongswiftError(f"'{p}' is {kind}, and {flag} here is a new directory: choose a new {flag}")
    if p.exists() and any(not _left_by_killed_writer(e) for e in p.iterdir()):  # (those the write removes)
        raise LongswiftError(f"'{p}' is a directory that is not empty: choose a new {flag}")
    return check_dir_writable(p, flag)


def absent_dirs(path: Path) -> list[Path]:
    """`path` and those of its ancestors that do not exist yet, nearest first: what mkdir(parents=True)
    makes, and what remove_made takes away again."""
    path = path.absolute()
    return [d for d in (path, *path.parents) if not d.exists()]


def make_dirs(path: Path) -> list[Path]:
    """mkdir(parents=True, exist_ok=True), durably: each directory made is fsynced into its parent, so an
    output renamed into it later (and fsynced there) does not vanish with its directory after a power cut.
    Returns the directories made, nearest first (for remove_made)."""
    made = absent_dirs(path)
    path.mkdir(parents=True, exist_ok=True)
    for d in made:
        _fsync_dir(d.parent)
    return made


def remove_made(dirs: list[Path]) -> None:
    """Remove directories a run made (absent_dirs, nearest first) as long as each is empty: once the one
    below it is gone, the next holds nothing of anyone else's."""
    for d in dirs:
        if not d.is_dir():  # never made (the run stopped before), or already gone
            continue
        try:
            d.rmdir()
        except OSError:  # not empty: neither are the ones above it ours to remove
            break


def write_dir_atomically(path: str | os.PathLike, write: Callable[[Path], None],
                         on_stale: Callable[[Path], None] | None = None) -> Path:
    """Have `write` fill a temporary directory, then move it into place. An absent `path` is the
    temporary sibling renamed: it appears whole or not at all, and parents made for it go on failure.
    An existing empty directory (the working directory, a mount point, a symlink's target) keeps its
    identity and gets each complete file by one rename; a failure takes back those already moved.

    The temporary directory (`.longswift-<random>.partial`) holds a lock while it is written; one that
    a killed run left (kill -9, a power cut: an export of a large model leaves gigabytes) is removed by
    the next write in the same place, and `on_stale` hears of it."""
    p = check_new_dir(path)
    existing = p.exists()
    made = make_dirs(p.parent)  # nearest first
    where = p if existing else p.parent
    for stale in remove_stale_dirs(where):
        if on_stale:
            on_stale(stale)
    tmp = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX, suffix=".partial", dir=where))
    moved: list[Path] = []
    held = None
    try:
        held = _hold_dir(tmp)
        os.chmod(tmp, 0o777 & ~_umask())
        write(tmp)
        for f in tmp.rglob("*"):
            if f.is_file() and f.name != _WRITING:
                os.chmod(f, 0o666 & ~_umask())  # as open() makes them (safetensors makes its files 0600)
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            elif f.is_dir():
                _fsync_dir(f)
        (tmp / _WRITING).unlink(missing_ok=True)  # still held: a sweep from here on finds no mark and keeps it
        _fsync_dir(tmp)  # its entries, before it (or they) are renamed into place
        if existing:
            for entry in sorted(tmp.iterdir()):
                os.replace(entry, p / entry.name)
                moved.append(p / entry.name)
            tmp.rmdir()
        else:
            os.replace(tmp, p)
        _fsync_dir(where)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for entry in moved:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        remove_made(made)
        raise
    finally:
        if held is not None:
            os.close(held)
    return p


_DIR_PREFIX = ".longswift-"
_WRITING = ".longswift-writing"  # the mark inside a temporary directory, locked by its writer while it writes


def _hold_dir(tmp: Path) -> int | None:
    """Mark a new temporary directory as being written: a file inside it, flock'ed until the writer is
    done (the lock goes with the process, however it ends). None where there is no flock (Windows)."""
    if fcntl is None:
        return None
    # Locked before it has the name a sweep looks for: between the open and the flock, a sweep (another export into
    # the same directory) found the mark unlocked and removed a live writer's directory. (Killed before the rename,
    # the directory has no mark and is left, as one killed before the mark was made.)
    fd = os.open(tmp / (_WRITING + ".new"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # new and ours alone: taken at once
    try:
        os.rename(tmp / (_WRITING + ".new"), tmp / _WRITING)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_stale_dirs(where: Path) -> list[Path]:
    """Remove the temporary directories in `where` that write_dir_atomically's writers left when they were
    killed; returns those removed."""
    removed = []
    for d in sorted(where.iterdir()):
        if _left_by_killed_writer(d):
            shutil.rmtree(d, ignore_errors=True)
            if not d.exists():
                removed.append(d)
    return removed


def _left_by_killed_writer(d: Path) -> bool:
    """Whether `d` is a temporary directory of write_dir_atomically's whose writer is gone: marked as being
    written, with nobody holding the mark's lock (a writer's death releases it, and no writer ever takes a
    directory it did not make). Without the mark it is not ours to judge: someone else's, or a writer's
    between its last file and its rename."""
    if fcntl is None or not (d.name.startswith(_DIR_PREFIX) and d.name.endswith(".partial")):
        return False
    try:
        fd = os.open(d / _WRITING, os.O_RDWR)
    except OSError:  # no mark, or not a directory
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # its writer is alive
        return False
    finally:
        os.close(fd)
    return True


def _fsync_dir(directory: Path) -> None:
    """Make the renames into `directory` durable: an fsynced file renamed into place can still be missing, or the
    old one, after a power cut until its directory is fsynced. Best effort: the rename is done and cannot be taken
    back, and some systems open or fsync no directory (Windows; a few network file systems)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read where the system shows it (Linux 4.7+): setting it to read it, as os.umask alone
    can, leaves a moment in which another thread of an embedding program creates files with a umask of 0."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask


_TEMP_CHARS = 8  # the random part of tempfile.mkstemp's names


def _new_temp(path: Path) -> tuple[int, Path]:
    """A new, uniquely named file next to `path` (`<name>.<random>.partial`), with the mode a plain
    `open()` would give `path` (its current mode if it exists), so two writers never share a temp file."""
    fd, name = tempfile.mkstemp(prefix=path.name + ".", suffix=".partial", dir=path.parent)
    os.fchmod(fd, _open_mode(path))
    return fd, Path(name)


def _open_mode(path: Path) -> int:
    """The permissions a plain `open(path, 'w')` leaves: the file's own if it exists, else 0666 less the umask."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o666 & ~_umask()


class AtomicFile:
    """A text file written as it goes to a unique `<name>.<random>.partial` (follow it with
    `tail -f`) and renamed over `<name>` only by `commit()`; `discard()` removes the temp file.
    `stage()` does all that can fail on a full disk (flush, fsync) but the rename, so that several
    files can be staged first and then committed together: all of them appear, or none."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = check_writable(path)
        fd, self.tmp = _new_temp(self.path)
        self.file: IO[str] = os.fdopen(fd, "w", encoding="utf-8")

    def write(self, text: str) -> None:
        with self._named():
            self.file.write(text)
            self.file.flush()

    def stage(self) -> None:
        if not self.file.closed:
            with self._named():
                self.file.flush()
                os.fsync(self.file.fileno())
                self.file.close()

    @contextmanager
    def _named(self) -> Iterator[None]:
        """A flush or fsync that fails (a full disk) names no file: say which one it was."""
        try:
            yield
        except OSError as exc:
            if exc.filename is None:
                exc.filename = str(self.path)
            raise

    def commit(self) -> None:
        self.stage()
        os.replace(self.tmp, self.path)
        _fsync_dir(self.path.parent)

    def discard(self) -> None:
        """Drop the temporary file, best effort: it runs while another error is on its way out, which an
        error of its own (a directory made read-only mid-run) would hide; a '.partial' left behind is
        removed by the next run that writes the file."""
        try:
            self.file.close()  # flushes what is buffered: on a full disk that raises, and is moot here
        except OSError:
            pass
        try:
            self.tmp.unlink(missing_ok=True)
        except OSError:
            pass


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write a whole text file atomically."""
    f = AtomicFile(path)
    try:
        f.write(text)
        f.commit()
    except BaseException:
        f.discard()
        raise


def append_atomic(path: str | os.PathLike, text: str) -> None:
    """Append to a text file by rewriting it atomically: readers see the old file or the new one. Appenders
    to one directory take turns (a lock on the directory), so two benches appending to one notes file at
    the same moment keep both reports: each rewrite read the file before the other's landed and lost it."""
    # The file write_atomic replaces: '--out=~/notes.md' (no shell expands that tilde) read './~/notes.md', found
    # nothing, and replaced ~/notes.md with the one report; and through a link, the directory turn is the target's.
    path = output_target(path)  # (its text is checked before a command's work too: check_appendable)
    with _directory_turn(path.parent):
        write_atomic(path, _text_to_append_to(path, "the output") + text)


@contextmanager
def _directory_turn(directory: Path) -> Iterator[None]:
    """Hold an advisory lock (flock) on `directory` itself while the body runs: no file is left behind, and a
    killed holder's turn ends with it. Without flock, or a directory that cannot be opened or locked, no turn is
    taken."""
    try:
        fd = os.open(directory, os.O_RDONLY) if fcntl is not None else None
    except OSError:  # (write_atomic says what is wrong with a directory it cannot write)
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # waits: another report's rewrite takes a moment
            except OSError:  # NFS locks only a file opened for writing (EBADF here), as flock(2) says: no turn
                pass
        yield
    finally:
        if fd is not None:
            os.close(fd)


def replace_atomically(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Have `write` create a file at a temporary sibling path, fsync it and rename it over `path`
    (for writers that want a path, such as safetensors and torch.save); nothing is left on failure."""
    path = output_target(path)
    if path.exists() and not path.is_file():  # renaming over it would replace a device, not write to it
        raise LongswiftError(f"'{path}' is not a regular file (a directory, device, pipe or socket): give a file name")
    fd, tmp = _new_temp(path)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _open_mode(path))  # writers that recreate the file (safetensors) leave it 0600
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def remove_stale_files(path: Path, on_stale: Callable[[Path], None] | None = None) -> None:
    """Remove the `<name>.<random>.partial` files beside `path` that writers killed while writing it left.
    Only for a caller that holds `path`'s OutputLock (or one that covers it): no other run writes it then."""
    for stale in sorted(path.parent.glob(glob.escape(path.name) + "." + "?" * _TEMP_CHARS + ".partial")):
        if stale.is_file():
            stale.unlink(missing_ok=True)
            if on_stale:
                on_stale(stale)


LOCK_SUFFIX = ".longswift-lock"  # (it was ".lock": an output named `Cargo` truncated and removed Cargo.lock)


def lock_path(path: Path) -> Path:
    """The lock file OutputLock holds beside `path` while a run writes it."""
    return path.with_name(path.name + LOCK_SUFFIX)


class OutputLock:
    """An advisory lock (flock) on `<name>.longswift-lock` next to each output file, held for a whole run,
    so a second run writing the same file is refused at once instead of interleaving with the first.
    The lock file is removed on release; a lock taken on a file that was removed meanwhile is
    taken again on the new one, so two runs can never both hold a path. A file of that name that is not
    a lock (not a regular file, or one holding anything but a pid) is refused, and left as it is.

    Holding a path's lock, no other run is writing it: a `<name>.<random>.partial` beside it was
    left by a run that was killed (kill -9, a power cut) and is removed; `on_stale` hears of each."""

    def __init__(self, paths: list[tuple[str, Path]], on_stale: Callable[[Path], None] | None = None) -> None:
        self.paths = paths  # (flag, path), e.g. ("--output", Path("out.txt"))
        self.on_stale = on_stale
        self._held: list[tuple[int, Path]] = []

    def __enter__(self) -> OutputLock:
        try:
            for flag, path in self.paths:
                self._acquire(flag, path)
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _acquire(self, flag: str, path: Path) -> None:
        if fcntl is None:
            return
        lock = lock_path(path)
        while True:
            try:  # (not through a link: another file would be truncated and removed as the lock)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
            except OSError:  # (a link; a directory, a socket: not to be opened so)
                if not (lock.is_symlink() or (lock.exists() and not lock.is_file())):
                    raise
                fd = -1
            if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
                if fd >= 0:
                    os.close(fd)
                raise LongswiftError(f"'{lock}', where a run writing '{path.name}' takes its lock, is not a lock file "
                                     f"(a link, directory, device or socket): move it away, or give another {flag}")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.read(fd, 32).decode("ascii", "replace").strip()
                os.close(fd)
                pid = f" (pid {owner})" if owner.isdigit() else ""
                raise LongswiftError(f"'{path}' is being written by another longswift run{pid}: wait for it to "
                                     f"finish, or give another {flag}") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(lock).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed it as we opened it: lock the new one
        held = os.pread(fd, 64, 0).strip()
        if os.fstat(fd).st_size > 32 or (held and not held.isdigit()):  # someone's file, which release() would remove
            os.close(fd)
            raise LongswiftError(f"'{lock}', where a run writing '{path.name}' takes its lock, is a file that is not "
                                 f"a lock (it holds other data): move it away, or give another {flag}")
        self._held.append((fd, lock))  # held from here on: released (and removed) even if the pid cannot be written
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as exc:  # (a full disk: the bare error named no file)
            raise OSError(exc.errno, exc.strerror, str(lock)) from exc
        remove_stale_files(path, self.on_stale)

    def release(self) -> None:
        for fd, lock in reversed(self._held):
            try:
                lock.unlink(missing_ok=True)  # still holding it: nobody else is between open and flock on it
            except OSError:  # (a directory made read-only meanwhile: a lock file left is taken over by the next run)
                pass
            finally:
                os.close(fd)
        self._held.clear()
