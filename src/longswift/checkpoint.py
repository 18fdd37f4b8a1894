"""Generation checkpoints: everything needed to continue a long generation in another process.

A checkpoint is taken between steps (the only moment the loop's state is consistent) and holds
the prompt and generated ids, the sampling RNG state, the configs, the stats so far and the
identity of the model and heads. What is *not* saved is rebuilt on resume: the KV cache by a
prefill of prompt + output, the n-gram table from the same ids (it is a function of them), the
partial cache by a fresh selection, and the adaptive-step timings (they only affect speed).

The file is JSON with a SHA-256 of its content, written atomically, so a truncated, edited or
corrupted checkpoint is refused instead of silently resuming from wrong state."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import torch

from .atomic import check_json_output, write_atomic
from .config import GenerationConfig
from .errors import ConfigError, ConfigTypeError, LongswiftError

FORMAT = "longswift-checkpoint"
FORMAT_VERSION = 1
# The config fields every checkpoint of this format holds (those of its first version). Fields added since
# may be absent from an older checkpoint, which resumes with their defaults, the behaviour it was made with.
ALWAYS_HELD = {
    "runtime": ("device", "dtype", "threads", "rope_scaling", "pack_weights"),
    "sampling": ("temperature", "top_k", "top_p", "min_p", "eta", "repetition_penalty", "penalty_window", "seed"),
    "generation": ("max_new_tokens", "ignore_eos", "prefill_chunk"),
    "spec": ("tree", "ngram_topk", "draft_mode", "draft_kv_budget", "draft_window", "attention_sinks", "adaptive"),
}


def _version() -> str:
    from . import __version__

    return __version__


EMBEDDED = "<embedded>"  # Checkpoint.model_source of a run of the embedded model (the one no --model names)


@dataclass
class Checkpoint:
    """A generation's state between two steps (see the module docstring)."""

    model_source: str  # the path it was loaded from, or EMBEDDED / "<ClassName>"
    model_fingerprint: str
    runtime: dict[str, Any]  # RuntimeConfig fields (dtype, device, rope scaling: they change the numbers)
    heads_source: str | None  # what set_heads was given ("auto", "default", a path or hub id, "random"); None for AR
    heads_fingerprint: str | None
    method: str
    sampling: dict[str, Any]
    generation: dict[str, Any]
    spec: dict[str, Any]
    prompt_ids: list[int]
    token_ids: list[int]  # generated so far (prompt excluded)
    rng_state: str | None  # base64 of the torch.Generator state; None for greedy
    stats: dict[str, Any]
    # CLI: where --output / --json went, and --checkpoint-every (so that a resume saves as often)
    outputs: dict[str, str | int | None] = field(default_factory=dict)
    version: str = field(default_factory=_version)
    # The model's answer to a fixed input (runtime.probe) and the dtype it ran in: {"dtype", "values"}. The
    # fingerprint is a corner of the embedding, which a fine-tune keeps; None in checkpoints made before it.
    model_probe: dict[str, Any] | None = None
    # Which draft heads a TokenSwift run had and where they came from, as `longswift info` says it ("4 heads from
    # the heads file PATH"): heads_source may be "auto", which another engine resolves otherwise. None before it.
    heads_origin: str | None = None

    def to_json(self) -> str:
        """The file's text: the body serialised once, in its canonical form (sorted keys), which the
        checksum covers. A save costs O(tokens so far); dataclasses.asdict's deep copy of the token
        ids and a second serialisation made it 83-87 ms at 100K tokens (a checkpoint every 1,024), now ~9."""
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # (no copy: serialised at once)
        canonical, digest = _canonical(body)
        head = json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, "sha256": digest}, separators=(",", ":"))
        return f'{head[:-1]},"checkpoint":{canonical}}}\n'

    def with_length(self, max_new_tokens: int) -> Checkpoint:
        """This run with a new length (at least the tokens it holds), e.g. to extend a finished run."""
        length = GenerationConfig(max_new_tokens=max_new_tokens).max_new_tokens  # (type and sign checked there)
        if length < len(self.token_ids):
            below = f"is below the {len(self.token_ids)} tokens the checkpoint holds: give at least that"
            raise ConfigError(f"max_new_tokens={length} {below}",
                              f"--max-new-tokens {length} {below}")
        return dataclasses.replace(self, generation={**self.generation, "max_new_tokens": length})

    def wrong_field(self) -> str | None:
        """What is of the wrong type in this checkpoint (as read_checkpoint refuses a file for), or None."""
        return _wrong_field(self)

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (temp file + fsync + rename): a crash leaves the previous checkpoint. A file at `path`
        that is not JSON (a text output, a heads file named by mistake) is refused, as --checkpoint refuses it."""
        _check_path(path, "Checkpoint.save")
        if not os.fspath(path).strip():  # (Path("") is ".", which was refused as "output path '.' is a directory")
            raise ConfigError("Checkpoint.save got an empty path: give a file name")
        target = Path(path).expanduser()
        check_json_output(target, "Checkpoint.save")
        write_atomic(target, self.to_json())


def _canonical(body: Any) -> tuple[str, str]:
    """A checkpoint body's canonical JSON (sorted keys, no spaces), as the file holds it, and its SHA-256, the
    checksum the file records: one definition for the writer and both readers."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return canonical, hashlib.sha256(canonical.encode()).hexdigest()


def _check_path(path: Any, what: str) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigTypeError(f"{what} takes a path (str or os.PathLike); got {type(path).__name__}")


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Load and verify a checkpoint file; a one-line error for anything missing, damaged or foreign."""
    _check_path(path, "read_checkpoint")
    p = Path(path).expanduser()
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise LongswiftError(f"checkpoint '{p}' does not exist: pass the file written by --checkpoint") from None
    except IsADirectoryError:
        raise LongswiftError(f"checkpoint '{p}' is a directory: pass the checkpoint file") from None
    except OSError as exc:
        raise LongswiftError(f"cannot read checkpoint '{p}': {exc.strerror}") from None
    damaged = f"checkpoint '{p}' is truncated or corrupt"
    if _text_not_json_object(raw.removeprefix(_BOM).strip()):  # (a text output named by mistake, not damage)
        raise LongswiftError(f"'{p}' is not a longswift generation checkpoint (a checkpoint is a JSON object): pass "
                             "the file written by --checkpoint")
    try:
        outer = json.loads(raw.removeprefix(_BOM).decode("utf-8"))  # (a byte order mark an editor added is no damage)
    except (ValueError, RecursionError):  # (not UTF-8, not JSON, nested past the parser's depth, a huge integer)
        raise LongswiftError(f"{damaged} (not valid JSON): resume from an earlier copy or start again") from None
    if not isinstance(outer, dict) or outer.get("format") != FORMAT:
        result = isinstance(outer, dict) and "token_ids" in outer and "stats" in outer  # (--json's file, mixed up)
        what = " (it is a --json result)" if result else ""
        raise LongswiftError(f"'{p}' is not a longswift generation checkpoint{what}: pass the file written by "
                             "--checkpoint")
    found = outer.get("format_version")
    if "format_version" not in outer or type(found) is not int:  # (bool is an int: true == 1)
        # ('"1"' read "has format version 1; this longswift reads version 1")
        what = "no format version" if "format_version" not in outer else f"format version {json.dumps(found)}"
        raise LongswiftError(f"{damaged} (it has {what}, where a checkpoint has a whole number): resume from an "
                             "earlier copy or start again")
    if found != FORMAT_VERSION:
        raise LongswiftError(f"checkpoint '{p}' has format version {found}; this longswift reads version "
                             f"{FORMAT_VERSION}: resume with the longswift that wrote it")
    body = outer.get("checkpoint")
    if not isinstance(body, dict) or _canonical(body)[1] != outer.get("sha256"):
        raise LongswiftError(f"{damaged} (checksum mismatch): resume from an earlier copy or start again")
    version = body.get("version")
    # Before the fields: another version's may differ from this one's, and that is not damage.
    if isinstance(version, str) and version != _version():
        raise LongswiftError(f"checkpoint '{p}' was written by longswift {version} and this is {_version()}: "
                             f"resume it with longswift {version} (outputs may differ across versions)")
    try:
        ckpt = Checkpoint(**body)
    except TypeError as exc:
        raise LongswiftError(f"{damaged} ({exc})") from None
    wrong = _wrong_field(ckpt)
    if wrong:  # an edit whose checksum was recomputed: the JSON is valid but its values are not
        raise LongswiftError(f"checkpoint '{p}' is not valid: {wrong}; resume from an unedited copy")
    return ckpt


_BOM = b"\xef\xbb\xbf"


def _text_not_json_object(raw: bytes) -> bool:
    """Whether a file's bytes are text that is no JSON object (no NUL bytes, UTF-8, not starting with '{'):
    another file named for a checkpoint; zeros or binary bytes are damage."""
    if not raw or raw.startswith(b"{") or b"\0" in raw:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def unfinished_run(path: str | os.PathLike) -> tuple[int, int] | None:
    """(tokens held, tokens asked for) of the run in an intact longswift checkpoint (its checksum holds) that
    has not ended, whichever version of longswift wrote it: a file that this one may refuse to resume, but that
    a new run must not replace (its own version resumes it). None for anything else."""
    try:
        outer = json.loads(Path(path).read_bytes().removeprefix(_BOM).decode("utf-8"))
        body = outer["checkpoint"]
        if outer["format"] != FORMAT or _canonical(body)[1] != outer["sha256"]:
            return None
        held, total = len(body["token_ids"]), body["generation"]["max_new_tokens"]
        reason = body["stats"].get("finish_reason")
    except (OSError, ValueError, RecursionError, LookupError, TypeError, AttributeError):
        return None
    if reason in ("eos", "stop") or not isinstance(total, int) or isinstance(total, bool) or held >= total:
        return None
    return held, total


def _is_id(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _wrong_field(c: Checkpoint) -> str | None:
    """What is of the wrong type in a checkpoint read from JSON (None when every field is right)."""
    def optional_str(v: Any) -> bool:
        return v is None or isinstance(v, str)

    checks = [
        ("model_source", isinstance(c.model_source, str), "a string"),
        ("model_fingerprint", isinstance(c.model_fingerprint, str), "a string"),
        ("heads_source", optional_str(c.heads_source), "a string or null"),
        ("heads_fingerprint", optional_str(c.heads_fingerprint), "a string or null"),
        ("heads_origin", optional_str(c.heads_origin), "a string or null"),
        ("method", isinstance(c.method, str), "a string"),
        ("rng_state", optional_str(c.rng_state), "a string or null"),
        ("version", isinstance(c.version, str), "a string"),
        *((name, isinstance(getattr(c, name), dict), "an object")
          for name in ("runtime", "sampling", "generation", "spec", "stats", "outputs")),
        ("prompt_ids", isinstance(c.prompt_ids, list) and all(map(_is_id, c.prompt_ids)), "a list of token ids"),
        ("token_ids", isinstance(c.token_ids, list) and all(map(_is_id, c.token_ids)), "a list of token ids"),
    ]
    for name, ok, expected in checks:
        if not ok:
            return f"{name} must be {expected}"
    for name, held in ALWAYS_HELD.items():  # one left out would resume at its default: another run, silently
        missing = [key for key in held if key not in getattr(c, name)]
        if missing:
            return f"{name} lacks {', '.join(missing)}"
    probe = c.model_probe
    if probe is not None and not (isinstance(probe, dict) and isinstance(probe.get("dtype"), str)
                                  and isinstance(probe.get("values"), list) and probe["values"]
                                  and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                          for x in probe["values"])):
        return "model_probe must be null or an object of a dtype and a list of numbers"
    if not all(optional_str(v) for k, v in c.outputs.items() if k != "checkpoint_every"):
        return "outputs must map names to paths"
    every = c.outputs.get("checkpoint_every")
    if every is not None and not (_is_id(every) and every > 0):
        return "outputs.checkpoint_every must be a positive number of tokens"
    return None


def encode_rng(generator: torch.Generator | None) -> str | None:
    if generator is None:
        return None
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")


def decode_rng(state: str | None) -> torch.Generator | None:
    if state is None:
        return None
    generator = torch.Generator(device="cpu")
    try:
        generator.set_state(torch.frombuffer(bytearray(base64.b64decode(state)), dtype=torch.uint8).clone())
    except (ValueError, RuntimeError):
        raise LongswiftError("the checkpoint's RNG state is damaged: resume from an earlier copy") from None
    return generator


def heads_fingerprint(heads: torch.nn.Module | None, any_precision: bool = False) -> str | None:
    """Identity of a set of draft heads: a hash of all their weights as they run, or (`any_precision`) of
    those rounded to bfloat16, which one heads file shares in float32 and in bfloat16 (a checkpoint of a
    GPU run, whose dtype 'auto' is bfloat16 there, continued on a CPU in float32)."""
    if heads is None:
        return None
    h = hashlib.sha256()
    for name, t in sorted(heads.state_dict().items()):
        h.update(name.encode())
        if any_precision:
            h.update(t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
        else:
            h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:32]
