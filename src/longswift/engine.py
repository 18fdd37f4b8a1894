"""The Python API: `longswift.load(...)` returns an Engine with `generate`, `stream` and `resume` (stream.py:
the GenerationStream they return) and `set_heads`."""

from __future__ import annotations

import copy
import os
import secrets
import shlex
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch

from .checkpoint import EMBEDDED, Checkpoint, decode_rng, heads_fingerprint, read_checkpoint
from .config import (HEADS_WORDS, GenerationConfig, RuntimeConfig, SamplingConfig, SpecConfig, dtype_name,
                     same_rope_scaling, unused_spec_fields)
from .encoding import Prompt, PromptEncoder, check_encodable
from .errors import ConfigError, ConfigTypeError, LongswiftError
from .generate import ar_steps
from .runtime.cuda_graphs import resolve_attention, use_graphs
from .runtime.loading import EMBED, HEAD_PREFIX, LoadedModel, check_finite, load_config, load_model
from .runtime.memory import check_context, keep_freed_buffers, return_freed_memory
from .runtime.model import Transformer
from .runtime.parallel import (ShardedRead, TensorParallel, require_process_group, shard_config, shard_state,
                               state_digest)
from .runtime.probe import model_probe, probe_tolerance, same_model
from .runtime.triton_kernels import triton_unavailable
from .spec.heads import DraftHeads, load_heads, model_fingerprint, new_heads, shipped_heads, training_record
from .spec.released import choose_heads, heads_from_tensors, load_released_heads, released_training_record
from .spec.tokenswift import tokenswift_steps
from .stats import GenerationResult, GenerationStats, ended
from .stop_strings import StopStrings
from .stream import GenerationStream, PrefillRelay, RunSetup

METHODS = ("ar", "tokenswift")


class Engine:
    """A loaded model ready to generate. With `tp`, the model is this rank's shard; every rank runs
    the same calls and gets the same tokens (rank 0 draws them)."""

    def __init__(self, loaded: LoadedModel, pack_weights: bool = True, runtime: RuntimeConfig | None = None,
                 tp: TensorParallel | None = None, device: torch.device | None = None,
                 model_source: str | None = None) -> None:
        self.runtime = runtime or RuntimeConfig()
        self.cfg = loaded.cfg  # the whole model's config (the model's own is its shard's under tp)
        self.tokenizer = loaded.tokenizer
        self._encoder: PromptEncoder | None = None  # the prompt encoder of self.tokenizer
        self.source = loaded.source
        # How to load this model again (checkpoints): EMBEDDED, an absolute path, or "<ClassName>".
        self.model_source = model_source or (
            loaded.source if loaded.source.startswith("<") else os.path.abspath(loaded.source))
        # The base model's identity (heads files, checkpoints), from its embedding as stored, before the cast.
        corner = loaded.embed_corner if loaded.embed_corner is not None else loaded.state[EMBED]
        self.fingerprint = model_fingerprint(loaded.cfg, corner)
        if tp is None:
            self.model = Transformer(loaded.cfg, loaded.state, pack=pack_weights,
                                     float32_logits=self.runtime.float32_logits,
                                     triton_kernels=self.runtime.triton_kernels)
        else:
            state = shard_state(loaded.cfg, loaded.state, tp.plan, device or tp.device, cut=loaded.cut)
            self.model = Transformer(shard_config(loaded.cfg, tp.plan), state, pack=pack_weights, tp=tp,
                                     float32_logits=self.runtime.float32_logits,
                                     triton_kernels=self.runtime.triton_kernels)
        self.tp = tp
        # The model's answer to a fixed input (checkpoints: runtime.probe). Under tensor parallelism it is a forward
        # every rank must run, so it runs here, where they all do; rank 0 alone writes checkpoints.
        self._probe: list[float] | None = model_probe(self.model) if tp is not None else None
        self.heads: DraftHeads | None = None
        self.heads_source: str | None = None  # what set_heads was given (recorded in checkpoints)
        self.heads_origin = "none"  # which heads set_heads found and where (for `longswift info`)
        self.heads_file: Path | None = None  # the heads file set_heads read them from (export-heads)
        self.heads_dir: Path | None = None  # ... or the TokenSwift-layout directory or GGUF (export-heads)
        self.hub_id = loaded.hub_id
        self._checkpoint_heads = loaded.head_tensors  # TokenSwift layout, inside the model checkpoint
        eos = set(loaded.cfg.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_ids = frozenset(eos)

    def ban_eos(self, sampling: SamplingConfig) -> SamplingConfig:
        """`sampling` with every EOS id of this model banned (what --ignore-eos means)."""
        eos = {t for t in self.eos_ids if t < self.cfg.vocab_size}
        return replace(sampling, banned_ids=(*sampling.banned_ids, *eos))

    def token_id(self, token: str) -> int:
        """The id of one token named by its text: an entry of the vocabulary as it is spelt there (a special token
        such as '<|im_start|>', or 'Ġthe' in a byte-level vocabulary), else text the tokenizer encodes as exactly
        one token (' the'). For banning tokens by name (SamplingConfig.banned_ids, generate's --ban-token)."""
        if not isinstance(token, str):
            raise ConfigTypeError(f"a token is named by its text (str); got {type(token).__name__}")
        if not token:
            raise ConfigError("an empty token text names no token: give its text, or its id")
        check_encodable(token, "the token text")
        if self.tokenizer is None:
            raise LongswiftError("this model has no tokenizer to look tokens up in: give token ids instead")
        vocab = getattr(self.tokenizer, "get_vocab", None)  # (a caller's tokenizer may lack it: text alone)
        entry = vocab().get(token) if vocab is not None else None
        encoded = [int(t) for t in self.tokenizer.encode(token, add_special_tokens=False)]
        if entry is not None:
            if len(encoded) == 1 and encoded[0] != int(entry):
                # A byte-level vocabulary spells lone bytes as characters: its entry 'é' is byte 0xE9, while the
                # text 'é' is another token. Which one was meant cannot be told: refused, naming both.
                raise ConfigError(f"{token!r} names two tokens of this model: the vocabulary entry {int(entry)} and "
                                     f"the text's token {encoded[0]}: give the id meant")
            return self._logit_id(token, int(entry))
        if not encoded:
            raise ConfigError(f"{token!r} encodes as no token of this model: give a token's text, or its id")
        if len(encoded) != 1:
            raise ConfigError(f"{token!r} is not one token of this model: it encodes as {len(encoded)} tokens "
                                 f"({encoded[:8]}{' ...' if len(encoded) > 8 else ''}); name a single token, or give "
                                 "its ids")
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is not None and encoded[0] == unk:  # text the vocabulary lacks, read as the unknown token
            raise ConfigError(f"{token!r} is not in this model's vocabulary (it reads as the unknown token "
                                 f"{unk}): name a token the vocabulary has, or give its id")
        return self._logit_id(token, encoded[0])

    def _logit_id(self, token: str, tid: int) -> int:
        """token_id's answer, refused where the tokenizer's id has no logit in the model."""
        if not 0 <= tid < self.cfg.vocab_size:
            raise ConfigError(f"{token!r} is token {tid} of the tokenizer, past this model's {self.cfg.vocab_size} "
                                 "logits")
        return tid

    def set_heads(self, heads: DraftHeads | str | None) -> None:
        """Draft heads for TokenSwift: a DraftHeads (of another dtype or device than the model's: a copy in
        those); "auto" (the heads inside the model checkpoint, TokenSwift's released layout, else the heads
        shipped for this model, else none); "default"
        (only the shipped ones); a heads file, a released checkpoint directory or hub id (its heads,
        for this same base model); "random" (seeded random heads: correct but slow, for testing);
        or None / "none" (AR only)."""
        check_heads_type(heads)
        if isinstance(heads, str) and not heads.strip():
            raise ConfigError("heads is an empty string: give a heads file or directory, 'auto', 'default', "
                                 "'random', 'none' or None")
        if isinstance(heads, os.PathLike):  # a pathlib.Path: read as the same path given as a string
            heads = os.fspath(heads)
        # Built in locals and set together at the end: a refused heads file leaves the engine as it was.
        source = "<DraftHeads>" if isinstance(heads, DraftHeads) else (None if heads is None else str(heads))
        if isinstance(heads, str) and heads not in HEADS_WORDS \
                and Path(heads).expanduser().exists():  # a local file or directory: recorded (checkpoints) absolute,
            source = os.path.abspath(os.path.expanduser(heads))  # so that a run resumes from any directory, as its
            # model (abspath, not Path.absolute: 'run/../heads' is recorded as the file it names)
        embed, origin = self.model.embed, "none"
        file: Path | None = None  # the heads file they were read from, if one
        released: Path | None = None  # ... or the TokenSwift-layout directory
        found: DraftHeads | None
        if heads is None or heads == "none" or isinstance(heads, DraftHeads):
            found = None if heads == "none" else heads  # type: ignore[assignment]
            origin = "none" if found is None else "given as a DraftHeads object"
            if found is not None:
                self._check_given_heads(found)
                if (found.weights.dtype, found.weights.device) != (embed.dtype, embed.device):
                    # (another engine's heads, of another dtype: the first draft pass failed in a product) a copy
                    # in this model's dtype and device; the object given stays as it was. Checked before the cast,
                    # as every heads source is: a float32 value past float16's range would run as an infinity
                    for name, p in found.named_parameters():
                        check_finite(name, p.detach(), str(source), embed.dtype)  # ("<DraftHeads>")
                    found = copy.deepcopy(found).to(device=embed.device, dtype=embed.dtype)
                    origin = f"given as a DraftHeads object (a copy in {str(embed.dtype).removeprefix('torch.')})"
        else:
            choice = choose_heads(heads, lambda: self._checkpoint_heads is not None,
                                  lambda: shipped_heads(self.fingerprint))
            found, path = None, choice.path
            if choice.kind == "checkpoint":
                assert self._checkpoint_heads is not None  # (choose_heads asked: in_checkpoint said there are some)
                found = heads_from_tensors(self._checkpoint_heads, self.cfg, self.fingerprint)
                found = found.to(device=embed.device, dtype=embed.dtype)
                origin = f"inside the model checkpoint ({HEAD_PREFIX}*, TokenSwift layout) {self.source}"
                # (a GGUF too: export-heads reads the heads there as stored, not as this run's dtype rounds them)
                released = Path(self.source) if Path(self.source).exists() else None
            elif choice.kind == "shipped":
                assert path is not None  # (a "shipped", "released" or "file" choice comes with its path)
                found, file = load_heads(path, self.cfg, embed, self.fingerprint), path
                origin = f"shipped with longswift for this model: {path}"
            elif choice.kind == "random":
                found = new_heads(self.cfg, self.model.state, fingerprint=self.fingerprint).randomize(seed=0)
                origin = "random (seeded, for testing)"
            elif choice.kind == "released":
                assert path is not None
                found, released = load_released_heads(path, self.cfg, embed, self.fingerprint), path
                origin = f"from the released checkpoint {path} ({HEAD_PREFIX}*, TokenSwift layout)"
            elif choice.kind == "file":
                assert path is not None
                found, file = load_heads(path, self.cfg, embed, self.fingerprint), path
                origin = f"from the heads file {path}"
        if found is not None:
            origin = f"{found.gamma} heads {origin}"
            found.requires_grad_(False)
        self.heads, self.heads_source, self.heads_origin = found, source, origin
        self.heads_file = file if found is not None else None
        self.heads_dir = released if found is not None else None

    def heads_training_record(self) -> dict | None:
        """What train-heads recorded of how these heads were made (spec.heads.training_record), where they came from
        a heads file or a released checkpoint that keeps it; None otherwise."""
        if self.heads_file is not None:
            return training_record(self.heads_file)
        return released_training_record(self.heads_dir) if self.heads_dir is not None else None

    def heads_note(self) -> str | None:
        """What to tell someone whose heads were trained under another rope scaling than this run's (None
        otherwise, and for heads without train-heads' record): the tokens are the same, since the model decides
        them, but the heads learnt hidden states of other positions, so fewer of their drafts are accepted."""
        record = self.heads_training_record()
        settings = record.get("settings") if isinstance(record, dict) else None
        if self.heads is None or record is None or not isinstance(settings, dict) or "rope_scaling" not in settings:
            return None
        if "rope" in record:  # the rope the base ran with, its own scaling included (a config with yarn)
            trained, now = record["rope"], self.cfg.rope_setting
        else:  # (records before it: the --rope-scaling flags alone)
            trained, now = settings["rope_scaling"], self.runtime.rope_scaling
        if same_rope_scaling(trained, now):
            return None
        said: dict[str | None, str] = {None: "no rope scaling"}
        return (f"these heads were trained with {said.get(trained, f'rope scaling {trained}')} and this run has "
                f"{said.get(now, f'rope scaling {now}')}: the tokens are the model's either way, but fewer drafts "
                "may be accepted; run with the heads' rope scaling, or train heads under this one")

    def _check_given_heads(self, heads: DraftHeads) -> None:
        """A DraftHeads object is refused as a heads file is: made for another model (the fingerprint that
        new_heads and load_heads record on it), or of another width (a refusal now, not a shape error in
        the first draft pass)."""
        width = heads.in_norms.shape[-1]
        if width != self.cfg.hidden_size:
            raise LongswiftError(f"these heads are {width} wide, this model's hidden size is {self.cfg.hidden_size}: "
                                 "they were made for another model; train heads for this model")
        made_for = heads.base_fingerprint
        if made_for is not None and made_for != self.fingerprint:
            raise LongswiftError("these heads were made for another model (their base model's fingerprint differs "
                                 "from this model's): train heads for this model")

    @property
    def has_checkpoint_heads(self) -> bool:
        """Whether the model checkpoint carries its own heads (what heads="auto" takes first)."""
        return self._checkpoint_heads is not None

    def encode(self, prompt: Prompt, chat: bool | None = False, system: str | None = None) -> list[int]:
        """Prompt text or ids (a list, or a 1-D tensor or array) -> ids. `chat`: wrap text in the model's
        chat template (True), send it as it is (False), or the template when the model has one (None, the
        CLI's default). `system`: the chat's system message (instead of the template's default one)."""
        if self._encoder is None or self._encoder.tokenizer is not self.tokenizer:  # (a tokenizer set since)
            self._encoder = PromptEncoder(self.tokenizer, self.cfg)
        return self._encoder.encode(prompt, chat, system)

    def stream(
        self,
        prompt: Prompt,
        sampling: SamplingConfig | None = None,
        generation: GenerationConfig | None = None,
        chat: bool | None = False,
        method: str | None = None,
        spec: SpecConfig | None = None,
        system: str | None = None,
        **fields_given: Any,
    ) -> GenerationStream:
        """Start a generation; iterate the returned stream for token ids as they are committed.
        The method defaults to TokenSwift when heads are set, AR otherwise. `chat` (see encode)
        defaults to False here: the API sends text as given unless asked (the CLI's default is None);
        `system` (see encode) is the chat's system message. Config fields may also come as keywords
        (`max_new_tokens=100, temperature=0.7, tree="1,3,3,3"`: each name belongs to one config), and
        override the fields of a config given beside them."""
        for name, value, cls in (("sampling", sampling, SamplingConfig), ("generation", generation, GenerationConfig),
                                 ("spec", spec, SpecConfig)):
            if value is not None and not isinstance(value, cls):
                raise ConfigTypeError(f"{name} must be a longswift.{cls.__name__}; got {type(value).__name__}")
        if fields_given:
            sampling, generation, spec = with_fields(fields_given, sampling, generation, spec)
        if chat is not None and not isinstance(chat, bool):
            raise ConfigTypeError(f"chat must be True, False or None; got {chat!r}")
        if method is not None and not isinstance(method, str):
            raise ConfigTypeError(f"method must be one of {', '.join(METHODS)} or None; got {method!r}")
        method = method if method is not None else ("tokenswift" if self.heads is not None else "ar")
        if method not in METHODS:  # ('' too: it ran the default method)
            raise ConfigError(f"unknown method '{method}': choose one of {', '.join(METHODS)}")
        if method == "tokenswift" and self.heads is None:
            raise LongswiftError("method='tokenswift' (--method tokenswift) needs draft heads and this model has "
                                 "none: train some with `longswift train-heads` and pass them (heads=PATH, --heads PATH; "
                                 "or 'random')")
        # TokenSwift's settings given as keywords are refused for AR; a SpecConfig (one object shared by the
        # runs of both methods, as bench's) is not read by AR
        drafting = sorted(set(fields_given) & {f.name for f in fields(SpecConfig)})
        if method == "ar" and drafting:
            why = "method='ar'" if self.heads is not None else "this engine has no draft heads, so it runs AR"
            raise ConfigError(f"{', '.join(drafting)} {'sets' if len(drafting) == 1 else 'set'} how TokenSwift "
                                 f"drafts and {why}: drop {'it' if len(drafting) == 1 else 'them'}, or generate with "
                                 "TokenSwift (draft heads, method='tokenswift')")
        # The run's own copies, checked again: a config changed after it was made (reused for the next request)
        # neither reaches a run already going nor skips its checks.
        spec = replace(spec) if spec is not None else SpecConfig()
        unused, why, _ = unused_spec_fields(spec, fields_given) if method == "tokenswift" else ([], "", "")
        if unused:  # (as for AR above: keywords that would change nothing without a word)
            raise ConfigError(f"{', '.join(unused)} {'sets' if len(unused) == 1 else 'set'} nothing here: {why}; "
                              f"drop {'it' if len(unused) == 1 else 'them'}")
        sampling = replace(sampling) if sampling is not None else SamplingConfig()
        generation = replace(generation) if generation is not None else GenerationConfig()
        if any(t >= self.cfg.vocab_size for t in sampling.banned_ids):
            raise ConfigError(f"banned token ids must be in [0, {self.cfg.vocab_size})",
                              f"--ban-ids must be in [0, {self.cfg.vocab_size})")
        if generation.ignore_eos:  # --ignore-eos bans every EOS id of the model (resolved once per run)
            sampling = self.ban_eos(sampling)
        if len(sampling.banned_ids) >= self.cfg.vocab_size:  # distinct ids, each below the vocabulary size
            raise LongswiftError(f"every one of this model's {self.cfg.vocab_size} token ids is banned "
                                 f"(banned_ids{', with ignore_eos banning the EOS ids' if generation.ignore_eos else ''}"
                                 "): leave at least one token allowed")
        ids = self.encode(prompt, chat, system)
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(62)
        generator = None
        if not sampling.greedy:
            generator = torch.Generator(device="cpu").manual_seed(seed)
        stats = GenerationStats(method=method, prompt_tokens=len(ids), seed=None if sampling.greedy else seed)
        return self._start(RunSetup(method, ids, sampling, generation, spec, generator), stats, [])

    def resume(self, checkpoint: Checkpoint | str | os.PathLike, max_new_tokens: int | None = None) -> GenerationStream:
        """Continue a checkpointed generation (a Checkpoint, or the path of a checkpoint file): the
        stream yields the tokens after the checkpoint's (its token_ids and result hold all of them)
        and the stats go on from the checkpoint's. Refused if this engine's model or heads are not the checkpoint's.
        `max_new_tokens`: a new length for the run (at least the tokens it holds), e.g. to extend a
        finished run; the tokens are those of a run started with that length (one that ended at EOS or
        a stop string stays ended)."""
        if isinstance(checkpoint, (str, os.PathLike)):
            checkpoint = read_checkpoint(checkpoint)
        if not isinstance(checkpoint, Checkpoint):
            raise ConfigTypeError(f"resume() takes a Checkpoint or the path of a checkpoint file; "
                                  f"got {type(checkpoint).__name__}")
        wrong = checkpoint.wrong_field()  # (a file's were checked as it was read; a Checkpoint object's are here)
        if wrong:
            raise LongswiftError(f"the checkpoint is not valid: {wrong}")
        if max_new_tokens is not None:
            checkpoint = checkpoint.with_length(max_new_tokens)
        c = checkpoint
        if self.fingerprint != c.model_fingerprint:
            raise _another_model(c.model_source, "")
        # The dtype the checkpoint's setting names on this engine's device ('auto' follows the device, as a run
        # continued on another device with --device does): a checkpoint of the CLI's 'auto' resumes on float32.
        made, this = c.runtime.get("dtype"), self.runtime.torch_dtype()
        try:
            made_dtype = None if made is None else replace(self.runtime, dtype=made).torch_dtype()
        except LongswiftError:
            raise LongswiftError(f"the checkpoint's settings are damaged (dtype {made!r})") from None
        if made_dtype != this:
            said = f"auto ({dtype_name(made_dtype)} here)" if made == "auto" and made_dtype is not None else made
            raise LongswiftError(f"the checkpoint was made with dtype {said} and this engine has {dtype_name(this)}: "
                                 "load the model with the checkpoint's dtype")
        for key, default in (("rope_scaling", None), ("float32_logits", False)):
            made_with, has = c.runtime.get(key, default), getattr(self.runtime, key)
            if key == "rope_scaling" and same_rope_scaling(made_with, has):  # (yarn:2 is yarn:2.0; a damaged
                made_with = has  # setting is refused below as another)
            if made_with != has:
                raise LongswiftError(f"the checkpoint was made with {key} {made_with} and this engine has "
                                     f"{has}: load the model with the checkpoint's settings")
        # (after the settings: another rope scaling answers otherwise too, and is named as such above)
        if not self._same_probe(c.model_probe):  # the same embeddings and shape: a fine-tune, or its base
            raise _another_model(c.model_source, ", whose embeddings this one shares but whose other weights differ")
        if c.method == "tokenswift" and self.heads is None:
            said = ("the checkpoint is a TokenSwift run and this engine has no draft heads: load the checkpoint's heads"
                    + (f", {c.heads_origin}" if c.heads_origin else ""))
            raise LongswiftError(f"{said} ({c.heads_source}; heads= or set_heads)", f"{said} (--heads {c.heads_source})")
        # (rounded to bfloat16: the heads of a GPU run in bfloat16 are those of a CPU run in float32; before session
        # 52 checkpoints hashed them as they ran)
        if c.method == "tokenswift" and c.heads_fingerprint not in (heads_fingerprint(self.heads, any_precision=True),
                                                                    heads_fingerprint(self.heads)):
            said = (f"the checkpoint was made with other draft heads ({c.heads_source}"
                    + (f": {c.heads_origin}" if c.heads_origin else "") + "): resume with the same heads")
            raise LongswiftError(f"{said} (heads= or set_heads)", f"{said} (--heads)")
        try:
            setup = RunSetup(c.method, list(c.prompt_ids), SamplingConfig(**c.sampling),
                             GenerationConfig(**c.generation), SpecConfig(**c.spec), decode_rng(c.rng_state))
            stats = GenerationStats.from_dict(c.stats)
        except (TypeError, LongswiftError) as exc:
            raise LongswiftError(f"the checkpoint's settings are damaged ({exc})") from None
        if setup.method not in METHODS or (setup.generator is None) != setup.sampling.greedy:
            raise LongswiftError("the checkpoint's method or RNG state is damaged: resume from an earlier copy")
        if not setup.prompt_ids or len(c.token_ids) > setup.generation.max_new_tokens:
            raise LongswiftError(f"the checkpoint's tokens are damaged ({len(setup.prompt_ids)} prompt tokens, "
                                 f"{len(c.token_ids)} generated of at most {setup.generation.max_new_tokens}): "
                                 "resume from an earlier copy")
        if any(not 0 <= t < self.cfg.vocab_size for t in setup.prompt_ids + c.token_ids):
            raise LongswiftError("the checkpoint's token ids do not fit this model's vocabulary")
        banned = setup.sampling.banned_ids  # (stream() refuses these; a resume raised an IndexError, or ran them)
        if any(t >= self.cfg.vocab_size for t in banned) or len(banned) >= self.cfg.vocab_size:
            raise LongswiftError(f"the checkpoint's banned token ids are damaged (past this model's "
                                 f"{self.cfg.vocab_size} ids, or all of them): resume from an earlier copy")
        generated = list(c.token_ids)
        if not ended(generated, setup.generation, self.eos_ids, stats.finish_reason):
            stats.resumes += 1  # (a finished run's checkpoint gives its result again: nothing re-read, no resume)
            stats.finish_reason = None  # running again (an extended run's file, and older mid-run files, say "length")
        return self._start(setup, stats, generated, resumed=True)

    def probe(self) -> dict[str, Any]:
        """The model's answer to a fixed input and the dtype it ran in, as checkpoints keep it (computed once)."""
        if self._probe is None:
            self._probe = model_probe(self.model)
        return {"dtype": dtype_name(self.model.dtype), "values": self._probe}

    def _same_probe(self, kept: dict[str, Any] | None) -> bool:
        """Whether a checkpoint's probe is this model's, to the rounding of the looser of the two dtypes (a GPU
        run's 'auto' is bfloat16, continued on a CPU in float32); a checkpoint without one passes."""
        if kept is None:
            return True
        ours = self.probe()
        theirs = {"float64": torch.float64, "float32": torch.float32}.get(kept["dtype"], torch.bfloat16)
        loose = max((theirs, self.model.dtype), key=probe_tolerance)
        return same_model(kept["values"], ours["values"], loose)

    def _start(self, r: RunSetup, stats: GenerationStats, generated: list[int],
               resumed: bool = False) -> GenerationStream:
        """`resumed`: a checkpoint's run, which keeps its rope scaling (none is advised when it is too long)."""
        check_context(self.cfg, len(r.prompt_ids), r.generation.max_new_tokens, rescalable=not resumed,
                      applied=self.runtime.rope_scaling)
        stats.processes = 1 if self.tp is None else self.tp.world
        stats.device, stats.dtype = str(self.model.device), dtype_name(self.model.dtype)
        if self.tp is not None:  # every rank runs the same generation (rank 0 draws: only its seed counts)
            heads = None if self.heads is None else (self.heads.gamma, self.heads_source)
            run = (r.method, r.prompt_ids, generated, replace(r.sampling, seed=None), r.generation, r.spec, heads)
            self.tp.agree("prompts, methods or settings", run)
        r = replace(r, heads=self.heads, heads_source=self.heads_source, heads_origin=self.heads_origin)
        stop = None
        if r.generation.stop:
            if self.tokenizer is None:
                raise LongswiftError("stop strings (--stop) need the model's tokenizer, and this model has none: "
                                     "leave them out")
            stop = StopStrings(self.tokenizer, r.generation.stop, generated)
        if stats.finish_reason == "stop" and generated:  # a run a stop string ended: resuming it goes no further
            return GenerationStream(self, r, iter(()), stats, generated)
        relay = PrefillRelay()
        device = self.model.device
        loop: dict[str, Any] = dict(cuda_graphs=use_graphs(self.runtime.cuda_graphs, self.model),
                                    read_every=self.runtime.token_block(device),
                                    graph_attention=resolve_attention(self.runtime.graph_attention, device),
                                    on_prefill=relay, resumed=resumed)
        # The run is checked and its caches made here, as the steps will use them (inference tensors): a run
        # that cannot be is refused by stream() itself, not at its first token, which would break the stream.
        with torch.inference_mode():
            if r.method == "ar":
                steps = ar_steps(self.model, r.prompt_ids, r.sampling, r.generation, stats, self.eos_ids, r.generator,
                                 generated, **loop)
            else:
                assert self.heads is not None  # (refused above: a TokenSwift run without heads)
                steps = tokenswift_steps(self.model, self.heads, r.prompt_ids, r.sampling, r.generation, r.spec, stats,
                                         self.eos_ids, r.generator, generated, **loop)
        return GenerationStream(self, r, _inference(steps), stats, generated, stop, relay)

    def generate(
        self,
        prompt: Prompt,
        sampling: SamplingConfig | None = None,
        generation: GenerationConfig | None = None,
        chat: bool | None = False,
        method: str | None = None,
        spec: SpecConfig | None = None,
        system: str | None = None,
        **fields_given: Any,
    ) -> GenerationResult:
        """Run a whole generation and return its result (the options are `stream`'s)."""
        stream = self.stream(prompt, sampling, generation, chat, method, spec, system, **fields_given)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result


def with_fields(given: dict[str, Any], sampling: SamplingConfig | None, generation: GenerationConfig | None,
                spec: SpecConfig | None) -> tuple[SamplingConfig, GenerationConfig, SpecConfig]:
    """The three configs with the fields given as keywords to stream/generate (each name belongs to one
    config) replacing theirs; a keyword that is no config field is refused."""
    configs: dict[str, Any] = {"sampling": sampling or SamplingConfig(),
                               "generation": generation or GenerationConfig(), "spec": spec or SpecConfig()}
    names = {f.name: key for key, config in configs.items() for f in fields(config)}
    unknown = next((name for name in given if name not in names), None)
    if unknown is not None and unknown in {f.name for f in fields(RuntimeConfig)}:
        raise ConfigTypeError(f"unexpected keyword argument '{unknown}': {unknown} is a RuntimeConfig setting of the "
                              f"loaded model: give it to longswift.load()")
    if unknown is not None:
        raise ConfigTypeError(f"unexpected keyword argument '{unknown}': generate and stream take sampling=, "
                              "generation=, chat=, method=, spec=, system= and the fields of SamplingConfig, "
                              "GenerationConfig and SpecConfig")
    for key in configs:
        mine = {name: value for name, value in given.items() if names[name] == key}
        if mine:
            configs[key] = replace(configs[key], **mine)  # (validated as the config's own constructor does)
    return configs["sampling"], configs["generation"], configs["spec"]


def _inference(steps: Iterator[list[int]]) -> Iterator[list[int]]:
    """Run each resumption of the loop under inference mode (a generator leaves the context between yields)."""
    while True:
        with torch.inference_mode():
            try:
                ids = next(steps)
            except StopIteration:
                return
        yield ids


def _another_model(source: str, how: str) -> LongswiftError:
    """A checkpoint made with another model (`source`, its Checkpoint.model_source): refused, saying how to load
    that one (the embedded model is the one no --model names)."""
    said = f"the checkpoint was made with another model ({source}){how}: resume with that model"
    if source == EMBEDDED:
        return LongswiftError(f"{said} (longswift.load() without a model)",
                              f"{said} (without --model: the embedded one)")
    if source.startswith("<"):  # a model object's class: one the caller holds
        return LongswiftError(f"{said} (load(model) with it)", f"{said} (--model: where it is saved)")
    return LongswiftError(f"{said} (load({source!r}))", f"{said} (--model {shlex.quote(source)})")


def check_heads_type(heads: Any) -> None:
    if not (heads is None or isinstance(heads, (DraftHeads, str, os.PathLike))):
        raise ConfigTypeError("heads must be a DraftHeads, a path or hub id, 'auto', 'default', 'random', 'none' or "
                              f"None; got {type(heads).__name__}")


def load(model: str | Any | None = None, runtime: RuntimeConfig | None = None,
         heads: DraftHeads | str | None = "auto", tensor_parallel: bool = False, tokenizer: Any = None,
         **runtime_fields: Any) -> Engine:
    """Load a GGUF file, an HF directory, a Hugging Face model id (`org/name[@revision]`), a transformers
    model object, or (None) the embedded default, and draft heads (see Engine.set_heads; by default
    "auto": the checkpoint's own heads, else those shipped for the model, so released TokenSwift
    checkpoints and the embedded model run TokenSwift out of the box; None for AR only). Runtime
    options (device, dtype, threads, pack_weights) come as a RuntimeConfig or as keywords; keywords
    given with a RuntimeConfig override its fields. `threads` is process-wide: it calls
    torch.set_num_threads, which stays set for every engine and torch call after it.
    `tensor_parallel=True` (every rank of an initialised torch.distributed default group calls it)
    shards the model across the ranks. `tokenizer`: a transformers tokenizer to use instead of the
    model's own (a model object passed in has none: text prompts, chat, stop strings and stream.text()
    need one)."""
    check_heads_type(heads)  # before the weights load
    if not (model is None or isinstance(model, (str, os.PathLike)) or callable(getattr(model, "state_dict", None))):
        raise ConfigTypeError("model must be a path, a Hugging Face model id, a transformers model or None (the "
                              f"embedded default); got {type(model).__name__}")
    if runtime is not None and not isinstance(runtime, RuntimeConfig):
        raise ConfigTypeError(f"runtime must be a longswift.RuntimeConfig; got {type(runtime).__name__}")
    if not isinstance(tensor_parallel, bool):
        raise ConfigTypeError(f"tensor_parallel must be True or False; got {tensor_parallel!r}")
    unknown = next((name for name in runtime_fields if name not in {f.name for f in fields(RuntimeConfig)}), None)
    if unknown is not None:
        elsewhere = any(unknown in {f.name for f in fields(c)} for c in (SamplingConfig, GenerationConfig, SpecConfig))
        raise ConfigTypeError(f"unexpected keyword argument '{unknown}': "
                              + (f"{unknown} is a generation setting: give it to generate() or stream()" if elsewhere
                                 else "load takes model, runtime=, heads=, tensor_parallel=, tokenizer= and the "
                                      f"fields of RuntimeConfig ({', '.join(f.name for f in fields(RuntimeConfig))})"))
    # Keywords given with a RuntimeConfig override its fields (they were dropped without a word).
    runtime = replace(runtime, **runtime_fields) if runtime is not None else RuntimeConfig(**runtime_fields)
    if runtime.threads:
        torch.set_num_threads(runtime.threads)
    device = runtime.torch_device()
    if runtime.triton_kernels and (why := triton_unavailable(device)) is not None:  # (device auto, no CUDA)
        raise LongswiftError(f"triton_kernels: {why}; leave it off", f"--triton-kernels: {why}; leave it off")
    tp, shard = None, None
    if tensor_parallel:
        require_process_group()  # (before the checkpoint is read)
        if model is None or isinstance(model, (str, os.PathLike)):  # split from its config, before any weight is read
            whole = load_config(model, runtime.rope_scaling)
            tp = TensorParallel(whole, device)
            shard = ShardedRead(tp.plan, whole.head_dim, runtime.torch_dtype())
    with torch.no_grad():  # not inference_mode: weights must stay usable by autograd (head training)
        # Sharded runs read the checkpoint on the CPU (an HF directory's weights cut to this rank's part as each file
        # is read) and move only this rank's shard to the device.
        loaded = load_model(model, runtime.torch_dtype(), torch.device("cpu") if tensor_parallel else device,
                            runtime.rope_scaling, shard)
    if tokenizer is not None:
        if not (callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))
                and hasattr(tokenizer, "__len__") and hasattr(tokenizer, "eos_token_id")):
            raise ConfigTypeError(f"tokenizer must be a transformers tokenizer (with encode, decode, len() and "
                                  f"eos_token_id); got {type(tokenizer).__name__}")
        if len(tokenizer) > loaded.cfg.vocab_size:
            raise LongswiftError(f"this tokenizer has {len(tokenizer)} tokens and the model's vocabulary "
                                 f"{loaded.cfg.vocab_size}: pass the model's own tokenizer")
        loaded = replace(loaded, tokenizer=tokenizer)
    pack = runtime.pack_weights
    if pack is None:  # a model object passed in is used without copies unless asked otherwise
        pack = model is None or isinstance(model, (str, os.PathLike))
    if tensor_parallel:
        tp = tp or TensorParallel(loaded.cfg, device)
        # What makes the numbers, the same on every rank: ranks loaded with another --dtype, --rope-scaling or
        # model wrote garbage with exit 0 (a dtype of other size crashed gloo), as the run's own settings do not
        tp.agree("models, dtypes or rope scalings", (dtype_name(runtime.torch_dtype()), runtime.rope_scaling,
                                                     runtime.float32_logits, state_digest(loaded.state, loaded.cut)))
    engine = Engine(loaded, pack_weights=pack, runtime=runtime, tp=tp, device=device,
                    model_source=EMBEDDED if model is None else None)
    engine.set_heads(heads)
    return_freed_memory()  # what the load converted and let go (the weights are resident by now)
    if device.type == "cpu":
        keep_freed_buffers()  # a forward's large temporaries from the heap, not freshly mapped pages each layer
    return engine
