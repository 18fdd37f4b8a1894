"""The one exception type users see: a one-line message that says what is wrong and what to do."""

import os
import re


# The remedy for text input to a model without a tokenizer, wherever text is read (data, prompts, prompt files).
ADD_TOKENIZER_FILES = "put its tokenizer files (tokenizer.json, tokenizer_config.json) in the model directory"


class LongswiftError(Exception):
    """A user-facing error; the CLI prints its message on one line and exits with status 2. Where the
    message names settings, it names them as the Python API spells them; `cli_message`, if given, names
    the command-line flags instead (`--top-k` for `SamplingConfig.top_k`)."""

    def __init__(self, message: str = "", cli_message: str | None = None) -> None:
        super().__init__(message)
        self.cli_message = cli_message or message


class LostContact(LongswiftError):
    """A collective of a tensor-parallel run failed: another of its processes exited or stopped answering."""


class AgreedError(LongswiftError):
    """A refusal that every process of a tensor-parallel run raises with the same message (their calls differed, or
    one of them refused and told the others): the command line prints it once per machine, not once per process."""


class ConfigError(LongswiftError, ValueError):
    """A bad config value: the message names the field (`SamplingConfig.top_k`), `cli_message` the flag."""


class ConfigTypeError(ConfigError, TypeError):
    """A value of the wrong type (a LongswiftError and a TypeError): says what was expected."""


def cli_text(exc: BaseException) -> str:
    """An error as the command line says it: in the flags' words where it has them (ConfigError's cli_message)."""
    return str(getattr(exc, "cli_message", None) or exc)


def reason_of(exc: BaseException, limit: int = 300) -> str:
    """Another library's error as the one-line reason of ours: its last line (transformers' validators put the
    reason there, under a line naming the validator), without the exception's type, cut at `limit` characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = re.sub(r"^[A-Za-z_]*(Error|Exception): ", "", lines[-1]) if lines else type(exc).__name__
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def utf8_path(path: os.PathLike | str) -> bool:
    """Whether a path's name is UTF-8 (a name of other bytes reaches Python as surrogates), which safetensors needs
    to open a file: it writes one anywhere, but opens none at a path of other bytes."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(path: os.PathLike | str) -> str:
    """A path that is not UTF-8 as a message can print it: its other bytes as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def refuse_non_utf8(path: os.PathLike | str, flag: str) -> None:
    """Refuse an output `flag` whose safetensors files could be written but never read back (utf8_path)."""
    if not utf8_path(path):
        raise LongswiftError(f"{flag} '{_shown(path)}' is not a UTF-8 path: safetensors files there could be "
                             "written but not read back; give a name of UTF-8 characters")


def unreadable(path: os.PathLike | str, what: str, exc: BaseException, damaged: str) -> LongswiftError:
    """Why a file could not be read: a path that is not UTF-8 (utf8_path), access to it (safetensors says "No such
    file or directory" for a file this user may not read), or what `damaged` says (the remedy for a truncated or
    corrupt file). `what` names the file's kind before its path ("heads file "; "" for weights)."""
    if not utf8_path(path):
        return LongswiftError(f"cannot read {what}'{_shown(path)}': safetensors opens no file whose path is not "
                              "UTF-8; rename the file (or its directory) in UTF-8 characters")
    if not os.access(path, os.R_OK):
        return LongswiftError(f"cannot read {what}'{path}': permission denied; give this user read access to it "
                              "(chmod a+r)")
    return LongswiftError(f"cannot read {what}'{path}': {reason_of(exc)}; {damaged}")
