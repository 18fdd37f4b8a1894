"""Self-distillation data: text the base model writes itself, sampled with the paper's settings.

Heads must predict *this* model's output, so the best training text is its own generations.
Generation is batched (many prompts at once) through a transformers twin of the loaded model that
shares its weights, with longswift's own logits transform (windowed penalty, filters) as a logits
processor, and cached on disk keyed by everything that determines it (the model by its fingerprint and rope
scaling, and each entry keeps the model's probe: a fine-tune with its base's embeddings is another model)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from ..atomic import write_atomic
from ..config import SamplingConfig, torch_seed
from ..errors import ADD_TOKENIZER_FILES, LongswiftError
from ..runtime.loading.tokenizer_cache import cache_root
from ..runtime.twin import hf_twin
from ..sampling import transform
from ..runtime.probe import model_probe, same_model
from .data import counted_starts

# Varied long-writing requests (stories, essays, explanations, letters, dialogue, technical prose).
PROMPTS = (
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Write a detailed essay on the history of the printing press and its effects on Europe.",
    "Explain in depth how a modern computer boots, from power-on to the login screen.",
    "Write a long letter from a grandmother to her grandson who is leaving for university.",
    "Describe a week in the life of a medieval blacksmith, day by day.",
    "Write a science fiction story about the first colony ship to reach another star.",
    "Write a travel guide to an imaginary island, with its towns, food, festivals and history.",
    "Explain photosynthesis to a curious high-school student, step by step, with examples.",
    "Write a mystery story set on a night train crossing the mountains.",
    "Write a long argumentative essay on whether cities should ban cars from their centres.",
    "Write a cookbook chapter about bread: its history, techniques and ten recipes.",
    "Tell the story of a small company that grows from a garage into a global business.",
    "Write a detailed tutorial on writing a web server in Python, with code and explanations.",
    "Write an epic fantasy tale about a young cartographer who maps a forbidden land.",
    "Write a long dialogue between a philosopher and a scientist about free will.",
    "Explain the causes and consequences of the French Revolution in detail.",
    "Write a diary of a sailor on a nineteenth-century whaling ship.",
    "Write a comprehensive guide to starting a vegetable garden, season by season.",
    "Write a long humorous story about a cat who believes it runs the household.",
    "Describe how the human immune system fights a viral infection, in depth.",
    "Write a biography of an invented jazz musician from New Orleans.",
    "Write a report on the future of renewable energy, with sections and arguments.",
    "Write a fairy tale about a river that wanted to flow uphill.",
    "Explain how neural networks learn, from a single neuron to deep networks.",
    "Write a long story told through letters between two friends over twenty years.",
    "Write a detailed history of an imaginary city from its founding to the present day.",
    "Write a thriller about a hacker who discovers a secret inside a bank's software.",
    "Write a long essay on what makes a good teacher, with stories from a classroom.",
    "Describe the journey of a single drop of water through the water cycle.",
    "Write a story about an astronaut stranded alone on a research station on Mars.",
    "Write a long guide to the rules and strategy of chess for beginners.",
    "Write the chronicle of a war between two mountain kingdoms, told by a historian.",
)


def _sampler(engine: Any) -> Any:
    """The transformers twin of the engine's model, with EOS unable to end a row (long generation
    runs with EOS ignored; unset values of a generation config passed to generate() are filled
    in from the model's own, so it is cleared there)."""
    twin = hf_twin(engine)
    twin.generation_config.eos_token_id = None
    return twin


class _LongswiftTransform:
    """transformers logits processor: longswift's transform (penalty over the last W tokens of
    each row, padding excluded, then temperature and filters)."""

    def __init__(self, sampling: SamplingConfig, pad_lengths: torch.Tensor) -> None:
        self.sampling, self.pad_lengths = sampling, pad_lengths  # [B]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        w = min(self.sampling.penalty_window, input_ids.shape[1])
        window = input_ids[:, input_ids.shape[1] - w :].clone()  # [B, W]
        column = torch.arange(input_ids.shape[1] - w, input_ids.shape[1], device=input_ids.device)
        window[column[None, :] < self.pad_lengths[:, None]] = -1  # left padding is not context
        return transform(scores, window, self.sampling).to(scores.dtype)


def _cache_key(engine: Any, n_tokens: int, new_tokens: int, batch: int, sampling: SamplingConfig,
               prompts: list[list[int]]) -> str:
    what = {"model": engine.fingerprint, "dtype": str(engine.model.dtype), "rope_scaling": engine.runtime.rope_scaling,
            "tokens": n_tokens, "new": new_tokens, "batch": batch, "sampling": asdict(sampling),
            "prompts": hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16], "version": 3}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def distill_prompts(engine: Any) -> list[list[int]]:
    """The built-in writing requests as token ids, in the model's chat template where it has one (a tokenizer's)."""
    return [engine.encode(p, chat=None) for p in PROMPTS]


def distilled_prompt_lengths(prompts: list[list[int]], n_tokens: int, new_tokens: int) -> list[int]:
    """The prompt length of each document self_distill writes from `prompts` (taken in turn), in its order, known
    before it samples: the tokens of each document that are context but not training targets
    (data.cut_counted_windows). Each document is its prompt + `new_tokens` (EOS is banned and no other token stops
    a row)."""
    return [len(prompts[i % len(prompts)]) for i in range(-(-n_tokens // new_tokens))]


def check_documents_fill(prompts: list[list[int]], new_tokens: int, window: int | None) -> None:
    """Refuse self-distilling documents (prompt + `new_tokens`) of which none reaches `window` tokens, or whose
    windows all hold only prompt tokens (no target): cut into windows, all of them would be dropped, after minutes
    of sampling."""
    longest = max((len(p) for p in prompts), default=0)
    if window is not None and longest + new_tokens < window:
        raise LongswiftError(f"self-distilled documents (a prompt of at most {longest} tokens + --distill-new-tokens "
                             f"{new_tokens}) are shorter than --seq-len {window}, so none would make a window: raise "
                             f"--distill-new-tokens to {window - longest} or lower --seq-len to {longest + new_tokens}")
    if window is not None and prompts and not any(counted_starts(len(p) + new_tokens, len(p), window) for p in prompts):
        need = min((len(p) // window + 1) * window - len(p) for p in prompts)
        raise LongswiftError(f"every --seq-len {window} window of the self-distilled documents (a prompt of at most "
                             f"{longest} tokens + --distill-new-tokens {new_tokens}) holds only prompt tokens, which "
                             f"are not trained on: raise --distill-new-tokens to at least {need}")


def default_cache_dir() -> Path | None:
    """`<cache root>/distill`: the cache root the tokenizer cache uses (`LONGSWIFT_CACHE_DIR`, else
    `$XDG_CACHE_HOME/longswift` or `~/.cache/longswift`); None when `LONGSWIFT_CACHE_DIR` is empty (off)."""
    root = cache_root()
    return None if root is None else root / "distill"


# Host bytes a sampled token costs while the documents are held (a Python int in a list, ~36, and its JSON text for
# the cache, ~11; measured 47 with tracemalloc, session 59), before the windows' int64 tensor.
DISTILL_BYTES_PER_TOKEN = 56


def check_distill_memory(n_tokens: int) -> None:
    """Refuse a --self-distill whose documents could not be held in this machine's memory (1e11 tokens went on
    building prompts for minutes, gigabytes deep, with no word)."""
    from ..runtime.memory import GiB, available_bytes

    need, free = n_tokens * DISTILL_BYTES_PER_TOKEN, available_bytes(torch.device("cpu"))
    if free is not None and need > free:
        raise LongswiftError(f"--self-distill {n_tokens:,} tokens would hold ~{need / GiB:,.1f} GiB of documents in "
                             f"memory, more than the {free / GiB:.1f} GiB available: lower it (the shipped heads used "
                             "98,304)")


def self_distill(engine: Any, n_tokens: int, new_tokens: int = 512, batch_size: int = 32,
                 sampling: SamplingConfig | None = None, cache_dir: Path | None = None,
                 progress: bool = True, prompts: list[list[int]] | None = None,
                 window: int | None = None) -> list[list[int]]:
    """Documents (prompt + generated ids) holding at least `n_tokens` generated tokens, sampled by
    the model itself (EOS is banned, as long generation with --ignore-eos bans it). Prompts default to
    the built-in writing requests (in the chat template when the model has one). Cached. `window`: the
    --seq-len the documents are cut into, refused before sampling if no document could fill one."""
    if n_tokens <= 0:
        raise LongswiftError(f"--self-distill must be a positive number of tokens, got {n_tokens}")
    check_distill_memory(n_tokens)
    sampling = sampling or SamplingConfig(seed=0)
    if sampling.seed is None:
        sampling = replace(sampling, seed=0)
    sampling = engine.ban_eos(sampling)  # as long generation with --ignore-eos: no EOS inside the text
    assert sampling.seed is not None  # (0 where none was given: the batches' seeds count from it)
    cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
    if prompts is None:
        if engine.tokenizer is None:
            raise LongswiftError("this model has no tokenizer, so it cannot self-distill from text prompts: "
                                 f"{ADD_TOKENIZER_FILES}, or pass prompts as token ids")
        prompts = distill_prompts(engine)
    longest, limit = max((len(p) for p in prompts), default=0), engine.cfg.context_limit
    if longest + new_tokens > limit:
        raise LongswiftError(f"--distill-new-tokens {new_tokens} + the longest prompt's {longest} tokens exceed this "
                             f"model's context of {limit}: lower --distill-new-tokens")
    check_documents_fill(prompts[: -(-n_tokens // new_tokens)], new_tokens, window)
    key = _cache_key(engine, n_tokens, new_tokens, batch_size, sampling, prompts)
    path = None if cache_dir is None else cache_dir / f"{key}.json"
    probe, dtype = model_probe(engine.model), engine.model.dtype
    cached = _entry(path, probe, dtype)
    n_docs = -(-n_tokens // new_tokens)
    prompts = [prompts[i % len(prompts)] for i in range(n_docs)]
    if cached is not None and len(cached) == n_docs and _written_from(cached, prompts, new_tokens):
        return cached
    from tqdm import tqdm
    from transformers import GenerationConfig as HFGenerationConfig

    twin = _sampler(engine)
    pad = 0
    # Our transform does the temperature and the filters: transformers' own are set to do nothing (left unset,
    # generate() filled them in from its defaults, and cut every draw to the top 50 tokens besides; found by review)
    hf_cfg = HFGenerationConfig(do_sample=not sampling.greedy, temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=new_tokens, min_new_tokens=0, eos_token_id=None, pad_token_id=pad)
    # Each batch is seeded on its own (seed + its first document), so a run stopped between batches goes on
    # from the batches it finished (kept beside the cache entry as they finish) to the same documents.
    partial = None if path is None else path.with_name(f"{key}.partial.json")
    documents = _finished_batches(partial, batch_size, probe, dtype)
    if len(documents) > n_docs or not _written_from(documents, prompts, new_tokens):
        documents = []
    bar = tqdm(total=n_docs * new_tokens, initial=len(documents) * new_tokens, desc="self-distill", unit="tok",
               disable=not progress)
    for lo in range(len(documents), n_docs, batch_size):
        group = prompts[lo : lo + batch_size]
        width = max(len(p) for p in group)
        pad_lengths = torch.tensor([width - len(p) for p in group])
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=engine.model.device)
        mask = (torch.arange(width)[None, :] >= pad_lengths[:, None]).long().to(ids.device)
        torch.manual_seed(torch_seed(sampling.seed + lo))
        streamer = _Progress(bar, len(group))
        with torch.no_grad():
            out = twin.generate(ids, attention_mask=mask, generation_config=hf_cfg, streamer=streamer,
                                logits_processor=[_LongswiftTransform(sampling, pad_lengths.to(ids.device))])
        for row, p in zip(out.tolist(), group):
            documents.append(row[width - len(p) :])
        if partial is not None and lo + batch_size < n_docs:
            _write_quietly(partial, documents, probe)
    bar.close()
    if path is not None and _write_quietly(path, documents, probe) and partial is not None:
        partial.unlink(missing_ok=True)
    return documents


def _written_from(documents: list[list[int]], prompts: list[list[int]], new_tokens: int) -> bool:
    """Whether cached `documents` are each its prompt (in turn) + `new_tokens`: what the training windows take each
    document's prompt length from (an entry that is not, hand-edited or of another layout, is sampled again rather
    than have its prompt tokens counted as targets, or the model's tokens masked)."""
    return all(isinstance(d, list) and len(d) == len(p) + new_tokens and d[: len(p)] == p
               for d, p in zip(documents, prompts))


def _entry(path: Path | None, probe: list[float], dtype: torch.dtype) -> list[list[int]] | None:
    """A cache file's documents, or None where there is none, it is damaged, or another model wrote it (its
    probe differs: a fine-tune's key is its base's)."""
    if path is None or not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())
        documents = entry["documents"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError, OSError):
        return None  # (a damaged entry is regenerated)
    if not isinstance(documents, list) or not same_model(entry.get("probe"), probe, dtype):
        return None
    return documents


def _finished_batches(partial: Path | None, batch_size: int, probe: list[float],
                      dtype: torch.dtype) -> list[list[int]]:
    """The documents of the batches an earlier, stopped run of the same key and model finished (none if there is
    no such file, or it is damaged)."""
    documents = _entry(partial, probe, dtype)
    if documents is None or len(documents) % batch_size:
        return []
    return documents


def _write_quietly(path: Path, documents: list[list[int]], probe: list[float]) -> bool:
    """Write a cache file; False if it cannot be (a cache that cannot be written is skipped, as the
    tokenizer cache does)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"documents": documents, "probe": probe}))
        return True
    except (OSError, LongswiftError):
        return False


class _Progress:
    """A transformers streamer that only advances a progress bar."""

    def __init__(self, bar: Any, rows: int) -> None:
        self.bar, self.rows, self.first = bar, rows, True

    def put(self, value: torch.Tensor) -> None:
        if self.first:  # the first put is the prompt
            self.first = False
            return
        self.bar.update(self.rows)

    def end(self) -> None:
        pass
