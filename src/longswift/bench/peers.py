"""The systems users would otherwise pick, run by the benchmark on the same model and prompt:
transformers `generate()` (plain and prompt-lookup decoding) and llama-cpp-python (plain and
prompt-lookup decoding, on the same GGUF file). Each is optional; a missing one is skipped."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import SamplingConfig
from ..errors import LongswiftError
from .metrics import Timeline

PEERS = ("hf", "hf-pld", "llamacpp", "llamacpp-pld")
Progress = Callable[[int, float], None]
_PACKAGES = {"hf": ("transformers", "transformers"), "hf-pld": ("transformers", "transformers"),
             "llamacpp": ("llama_cpp", "llama-cpp-python"), "llamacpp-pld": ("llama_cpp", "llama-cpp-python")}


def missing(method: str) -> str | None:
    """Why a peer cannot run here (its package is not importable), or None."""
    module, dist = _PACKAGES[method]
    try:
        importlib.import_module(module)
    except ImportError:
        return f"not installed: pip install {dist}"
    except Exception as exc:  # installed, but it fails as it loads (llama_cpp: its native library will not load)
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0]}" if str(exc) else type(exc).__name__
        return f"installed but fails to import ({why}); reinstall it: pip install --force-reinstall {dist}"
    return None


def version(module: str) -> str | None:
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:  # (not installed, no __version__, or failing as it loads: missing() says why)
        return None


@dataclass
class PeerOutput:
    token_ids: list[int]
    timeline: Timeline


class _Streamer:
    """transformers streamer that times each batch of generated tokens (the first put is the prompt)."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.calls = 0
        self.count = 0

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls > 1:
            self.count += value.numel()
            self.timeline.record(self.count)

    def end(self) -> None:
        pass


class HFRunner:
    """transformers `generate()` on a twin of our model (the same weight tensors, dtype and device);
    with `pld`, prompt-lookup decoding proposing that many tokens per step."""

    def __init__(self, model: Any, pld: int | None = None, eos_ids: tuple[int, ...] = ()) -> None:
        self.model = model
        self.pld = pld
        self.eos_ids = eos_ids  # masked by min_new_tokens = n: EOS is never emitted, as under our --ignore-eos

    @staticmethod
    def sampler_note(s: SamplingConfig) -> str | None:
        if s.repetition_penalty != 1.0:
            return "repetition penalty over the whole sequence (prompt included), not the last " \
                   f"{s.penalty_window} tokens; own RNG"
        return None if s.greedy else "own RNG (same distribution, different draws)"

    @staticmethod
    def unsupported(s: SamplingConfig) -> str | None:
        return None

    def run(self, prompt: list[int], n: int, s: SamplingConfig, progress: Progress | None = None) -> PeerOutput:
        timeline = Timeline(n, progress=progress)
        streamer = _Streamer(timeline)
        ids = torch.tensor([prompt], device=self.model.device)
        kwargs: dict[str, Any] = {"repetition_penalty": s.repetition_penalty}
        if s.greedy:
            kwargs |= {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
        else:
            kwargs |= {"do_sample": True, "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                       "min_p": s.min_p or None, "eta_cutoff": s.eta}
            torch.manual_seed(s.seed or 0)
        if self.pld:
            kwargs["prompt_lookup_num_tokens"] = self.pld
        timeline.start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                      streamer=streamer, pad_token_id=0, eos_token_id=list(self.eos_ids) or None, **kwargs)
        tokens = out[0, len(prompt):].tolist()
        if len(tokens) != n:
            raise LongswiftError(f"transformers generated {len(tokens)} tokens instead of {n}: leave hf out of --methods")
        return PeerOutput(tokens, timeline)


def sampler_note(method: str, sampling: SamplingConfig) -> str | None:
    """How a peer's sampling differs from ours under `sampling` (None for ours, or where it does not)."""
    if method.startswith("hf"):
        return HFRunner.sampler_note(sampling)
    if method.startswith("llamacpp"):
        return LlamaCppRunner.sampler_note(sampling)
    return None


class LlamaCppRunner:
    """llama-cpp-python on the same GGUF file: llama.cpp's own kernels on the file's (possibly
    quantized) weights; with `pld`, its prompt-lookup draft model (which needs logits_all=True)."""

    def __init__(self, gguf: Path, n_ctx: int, threads: int, seed: int, pld: int | None = None,
                 eos_ids: tuple[int, ...] = ()) -> None:
        from llama_cpp import Llama, LogitsProcessorList
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.pld = pld
        self.n_ctx = n_ctx
        self.seed = seed
        # EOS banned, as under our --ignore-eos and transformers' min_new_tokens: llama.cpp's generate() emitted it
        # and went on (the embedded model's greedy chat answer at its 33rd token), where ours had other tokens
        ban = list(eos_ids)

        def no_eos(_ids: Any, scores: Any) -> Any:
            scores[ban] = float("-inf")
            return scores

        self.no_eos = LogitsProcessorList([no_eos]) if ban else None
        draft = LlamaPromptLookupDecoding(num_pred_tokens=pld) if pld else None
        try:
            self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads,
                             logits_all=bool(pld), draft_model=draft, seed=seed, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:  # llama.cpp's own refusal (an architecture it lacks)
            raise LongswiftError(f"llama.cpp cannot load '{gguf}' ({exc}): leave llamacpp out of --methods") from None

    @staticmethod
    def sampler_note(s: SamplingConfig) -> str | None:
        # (its penalty sampler is given only the tokens generate() draws: the prompt is never in its window)
        window = (f"; the repetition penalty's window holds the last {s.penalty_window} generated tokens, never the "
                  "prompt's" if s.repetition_penalty != 1.0 else "")
        if s.greedy:
            return window.removeprefix("; ") or None
        return "llama.cpp sampler chain (penalty, top-k, top-p, min-p, temperature) and its own RNG" + window

    @staticmethod
    def unsupported(s: SamplingConfig) -> str | None:
        if s.eta > 0:
            return "llama.cpp has no eta-sampling"
        return None

    def run(self, prompt: list[int], n: int, s: SamplingConfig, progress: Progress | None = None) -> PeerOutput:
        if len(prompt) + n > self.n_ctx:
            raise LongswiftError(f"llama.cpp's context of {self.n_ctx} tokens is below the {len(prompt) + n} of this run: "
                                 "leave llamacpp out of --methods")
        self.llm.set_seed(s.seed or self.seed)
        self.llm.last_n_tokens_size = max(1, s.penalty_window)  # the penalty window, read when generate() starts
        self.llm.reset()  # n_tokens = 0: no reuse of the previous run's KV cache for a shared prompt prefix
        timeline = Timeline(n, progress=progress)
        tokens: list[int] = []
        timeline.start = time.perf_counter()
        stream = self.llm.generate(prompt, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, typical_p=1.0,
                                   temp=s.temperature, repeat_penalty=s.repetition_penalty, reset=True,
                                   logits_processor=self.no_eos)
        for token in stream:
            tokens.append(int(token))
            timeline.record(len(tokens))
            if len(tokens) == n:
                break
        stream.close()
        return PeerOutput(tokens, timeline)
