"""A generation in progress: the stream `Engine.stream` returns (token ids or text as they come, the result,
checkpoints between steps), and what it was started with."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from .checkpoint import Checkpoint, encode_rng, heads_fingerprint
from .config import GenerationConfig, SamplingConfig, SpecConfig
from .detok import IncrementalDecoder, decode_text
from .errors import ConfigError, ConfigTypeError, LongswiftError
from .spec.heads import DraftHeads
from .stats import FINISH_REASONS, GenerationResult, GenerationStats, ended
from .stop_strings import StopStrings


@dataclass
class RunSetup:
    """What a generation was started with: enough, with the stream's ids, to checkpoint it."""

    method: str
    prompt_ids: list[int]
    sampling: SamplingConfig
    generation: GenerationConfig
    spec: SpecConfig
    generator: torch.Generator | None
    heads: DraftHeads | None = None  # the engine's heads when the run started (set_heads may change them later)
    heads_source: str | None = None
    heads_origin: str | None = None  # which heads those were and where they came from (Engine.heads_origin)


class PrefillRelay:
    """What the steps call as their prefill reads the context: the stream's `on_prefill`, set by the caller
    after the steps were made (they run at the first iteration)."""

    def __init__(self) -> None:
        self.fn: Callable[[int, int], None] | None = None

    def __call__(self, read: int, total: int) -> None:
        if self.fn is not None:
            self.fn(read, total)


class GenerationStream:
    """Iterate to get the token ids of each step; `result` is set once iteration ends.
    Between steps (in the loop body), `checkpoint()` snapshots the run so it can be resumed.
    `on_prefill`: set it to a function of (tokens read, tokens to read) to follow the reading of the
    context, which the first iteration does (the prompt; on a resume, the prompt and the output so far)."""

    def __init__(self, engine: Any, setup: RunSetup, steps: Iterator[list[int]], stats: GenerationStats,
                 previous: list[int] | None = None, stop: StopStrings | None = None,
                 relay: PrefillRelay | None = None) -> None:
        self._engine = engine  # the Engine that started it (its tokenizer, identity and runtime settings)
        self._relay = relay or PrefillRelay()
        self._setup = setup
        self._steps = steps
        self._stop = stop
        self.stats = stats  # live: updated as the generation runs
        self.token_ids: list[int] = list(previous or [])  # all generated ids, earlier runs' included
        self.result: GenerationResult | None = None
        # Set when a step raised (a KeyboardInterrupt inside a forward): the RNG state and stats of
        # the step boundary before it, which checkpoint() then uses, since the live ones are mid-step.
        self._interrupted: tuple[torch.Tensor | None, GenerationStats] | None = None
        self._heads_fingerprint: str | None = None  # the heads' hash, once (a run's heads do not change)

    @property
    def on_prefill(self) -> Callable[[int, int], None] | None:
        return self._relay.fn

    @on_prefill.setter
    def on_prefill(self, fn: Callable[[int, int], None] | None) -> None:
        if fn is not None and not callable(fn):
            raise ConfigTypeError(f"on_prefill must be a function of (tokens read, tokens to read) or None; "
                                  f"got {type(fn).__name__}")
        self._relay.fn = fn

    @property
    def max_new_tokens(self) -> int:
        return self._setup.generation.max_new_tokens

    def __iter__(self) -> Iterator[list[int]]:
        if self._interrupted is not None:
            raise LongswiftError("this stream stopped at an exception inside a step and cannot go on: continue it "
                                 "with engine.resume(stream.checkpoint()) (the state before that step)")
        generator = self._setup.generator
        while True:
            boundary = (None if generator is None else generator.get_state(),
                        replace(self.stats, stage_seconds=dict(self.stats.stage_seconds)))
            try:  # until the step's tokens are recorded: an exception before that leaves the state mid-step
                ids = next(self._steps)
                keep = self._stop.cut(ids) if self._stop is not None else None
                if keep is not None:  # a stop string ends the run: the tokens after it in this step are dropped
                    self.stats.drop(ids, keep, boundary[1])
                    self.stats.finish_reason = "stop"
                    ids = ids[:keep]
                    self._steps.close()  # type: ignore[attr-defined]
            except StopIteration:
                break
            except BaseException:
                self._interrupted = boundary
                raise
            self.token_ids.extend(ids)
            yield list(ids)  # (a copy: the caller may change it; AR's loop reads its block after the yield)
            if keep is not None:
                break
        self.result = self._result(self.stats)

    def text(self) -> Iterator[str]:
        """Iterate the stream (in place of its token ids) for the generated text as it comes: pieces that
        add up to result.text, a piece held back while its last character is incomplete (a token can end
        inside one). The first piece of a resumed stream (or of one iterated before) is the text so far;
        checkpoint() and result work as with the ids."""
        if self._engine.tokenizer is None:
            raise LongswiftError("this model has no tokenizer, so there is no text: iterate the stream for token ids")
        decoder = IncrementalDecoder(self._engine.tokenizer)
        if self.token_ids:
            earlier = decoder.push(list(self.token_ids))
            if earlier:
                yield earlier
        for ids in self:
            piece = decoder.push(ids)
            if piece:
                yield piece
        rest = decoder.flush()
        if rest:
            yield rest

    def complete(self) -> bool:
        """Whether the run holds all its tokens (its length, an EOS, a stop string): iterating on would end it
        without another step."""
        return ended(self.token_ids, self._setup.generation, self._engine.eos_ids, self.stats.finish_reason) is not None

    def result_so_far(self, finish_reason: str | None = None) -> GenerationResult:
        """The ids and text generated so far with the stats (a copy while running; `finish_reason` if given,
        e.g. "interrupted" for a run stopped between steps; unless given, the live stats' reason: None while
        the run goes on, as after a `break`, and "stop" from the step a stop string ended it). After a step
        raised, the stats of the step boundary before it, which the ids are at (as checkpoint() saves)."""
        if finish_reason is not None and finish_reason not in FINISH_REASONS:
            raise ConfigError(f"finish_reason must be one of {', '.join(FINISH_REASONS)} or None; got {finish_reason!r}")
        if finish_reason is None and self.result is not None:  # ended: its own reason
            return self._result(self.stats)
        stats = self.stats if self._interrupted is None else self._interrupted[1]
        # (its own stage_seconds: the running stream's dict goes on changing)
        return self._result(replace(stats, finish_reason=finish_reason or stats.finish_reason,
                                    stage_seconds=dict(stats.stage_seconds)))

    def _result(self, stats: GenerationStats) -> GenerationResult:
        text = None if self._engine.tokenizer is None else decode_text(self._engine.tokenizer, self.token_ids)
        return GenerationResult(list(self.token_ids), text, stats)

    @property
    def failed_in_step(self) -> bool:
        """Whether iteration stopped at an exception inside a step (checkpoint() is then the state before it)."""
        return self._interrupted is not None

    def checkpoint(self, outputs: dict[str, str | int | None] | None = None) -> Checkpoint:
        """The run's state now; call between steps (not from another thread). After a step raised
        (a KeyboardInterrupt inside a step), the state before that step: resuming it gives the
        uninterrupted run's tokens."""
        if outputs is not None and not isinstance(outputs, dict):
            raise ConfigTypeError(f"outputs must be a dict of names to paths; got {type(outputs).__name__}")
        e, r = self._engine, self._setup
        rng_state, stats = encode_rng(r.generator), self.stats
        if self._interrupted is not None:
            state, stats = self._interrupted
            rng_state = None if state is None else encode_rng(torch.Generator(device="cpu").set_state(state))
        ckpt = Checkpoint(
            model_source=e.model_source, model_fingerprint=e.fingerprint,
            runtime=asdict(e.runtime), heads_source=r.heads_source if r.method == "tokenswift" else None,
            heads_fingerprint=self._heads_hash() if r.method == "tokenswift" else None,
            method=r.method, sampling=asdict(r.sampling), generation=asdict(r.generation), spec=asdict(r.spec),
            prompt_ids=list(r.prompt_ids), token_ids=list(self.token_ids), rng_state=rng_state,
            stats=stats.to_dict(), outputs=dict(outputs or {}), model_probe=e.probe(),
            heads_origin=r.heads_origin if r.method == "tokenswift" else None,
        )
        wrong = ckpt.wrong_field()  # (only `outputs` can be: a file that read_checkpoint would refuse)
        if wrong:
            raise ConfigTypeError(f"checkpoint(outputs=...): {wrong}")
        return ckpt

    def _heads_hash(self) -> str | None:
        """The run's heads' fingerprint, hashed at the first checkpoint only: it reads every weight (0.3 s
        for heads of an 8B model's size, at every save)."""
        if self._heads_fingerprint is None:
            self._heads_fingerprint = heads_fingerprint(self._setup.heads, any_precision=True)
        return self._heads_fingerprint
