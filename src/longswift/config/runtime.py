"""RuntimeConfig: where and in what precision the model runs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ConfigError, LongswiftError
from .checks import flag_help, validated
from .parsing import DTYPES, parse_rope_scaling

if TYPE_CHECKING:  # (torch is imported where it is used: the command line parses its flags without it)
    import torch

# More CPU threads than any machine has cores: refused, since past the OS's thread limit OpenMP fails
# to start them and the process crashes (100000 segfaults here) instead of raising.
MAX_THREADS = 1024
READ_EVERY_CUDA = 16  # RuntimeConfig.read_every's auto on CUDA: ~50 ms of tokens per block at 300 tok/s
GRAPH_ATTENTIONS = ("bucketed", "length")  # RuntimeConfig.graph_attention (runtime.cuda_graphs)


@dataclass
class RuntimeConfig:
    """Where and in what precision the model runs."""

    device: str = field(default="auto", metadata=flag_help("cpu, cuda, cuda:N or auto"))
    dtype: str = field(
        default="auto", metadata=flag_help("float32, bfloat16, float16, float64 or auto (fp32 on CPU, bf16 on CUDA)",
                                           choices=("auto", "float32", "bfloat16", "float16", "float64"))
    )
    threads: int | None = field(default=None, metadata=flag_help(
        "CPU threads for torch (default: torch's, one per core; on a shared machine, the cores that are free)"))
    rope_scaling: str | None = field(default=None, metadata=flag_help(
        "extend the model's context on purpose: TYPE:FACTOR with TYPE yarn, linear or dynamic (e.g. yarn:4)"))
    pack_weights: bool | None = field(
        default=None,
        metadata=flag_help("run CPU linears on oneDNN-packed weight copies (faster; each replaces its weight, a tied "
                           "LM head's copy is the one extra); where "
                           "packing does not exist (CUDA) store each layer's q/k/v and gate/up weights as one matrix "
                           "each instead (one product for each, no extra memory); default: on for checkpoint files, "
                           "off for a transformers model passed in (no copy)"),
    )
    cuda_graphs: str = field(default="auto", metadata=flag_help(
        "replay decode, draft and verify steps as CUDA graphs: auto (wherever supported: CUDA, no tensor "
        "parallelism, no dynamic rope), on (required), off", choices=("auto", "on", "off")))
    read_every: int = field(default=0, metadata=flag_help(
        "AR reads sampled tokens back from the device N at a time, so the GPU never idles while the host "
        "waits on each token; the tokens are the same for every N, they stream in blocks of N. "
        "0 = auto: 1 on CPU, 16 on CUDA"))
    graph_attention: str = field(default="auto", metadata=flag_help(
        "how the CUDA step bodies attend over a cache that grows while their shapes stay fixed: length "
        "(flash reads the cached length from device memory; a graph per doubling of the context and node "
        "budget) or bucketed (flash over whole 1,024-slot buckets plus a masked part over the rest; a graph per bucket "
        "and node budget); the same attention in other float sums. auto: length where this torch's flash "
        "kernel takes seqused_k, else bucketed (on an H100, 8B shape, length's AR step is the faster: "
        "docs/benchmarks.md)",
        choices=("auto", *GRAPH_ATTENTIONS)))
    float32_logits: bool = field(default=False, metadata=flag_help(
        "compute the LM head's logits in float32 (float32 sums and output from a bfloat16/float16 model's "
        "inputs) instead of rounding them to the model's dtype; no effect in float32/float64. For measuring "
        "whether it keeps reduced-precision TokenSwift on AR's greedy tokens longer; not yet measured on a GPU"))
    triton_kernels: bool = field(default=False, metadata=flag_help(
        "CUDA: run each layer's rope with its cache writes, and SwiGLU, as one Triton kernel each (5 kernels fewer "
        "a layer in a step), its RMSNorms as Triton's, and with --graph-attention length its attention as "
        "Triton's (all of a verify pass's rows a KV head in one block, the keys split among the GPU's "
        "multiprocessors); needs triton (CUDA builds of torch include it). Equal to the eager ops to the dtype's "
        "rounding, not bit for bit; not yet timed on a GPU"))

    @validated
    def __post_init__(self) -> None:
        if self.dtype not in ("auto", *DTYPES):
            raise LongswiftError(f"--dtype must be one of auto, {', '.join(DTYPES)}; got '{self.dtype}'")
        if self.device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:[0-9]+)?", self.device):
            raise LongswiftError(f"--device must be cpu, cuda, cuda:N or auto; got '{self.device}'")
        if self.device.startswith("cuda") and not _cuda():
            raise ConfigError(f"RuntimeConfig.device='{self.device}' but no CUDA device is available: use device='cpu'",
                              f"--device {self.device} requested but no CUDA device is available; use --device cpu")
        if self.device.startswith("cuda:") and int(self.device[5:]) >= _cuda_count():
            there = f"this machine has {_cuda_count()} CUDA device(s), numbered from 0"
            raise ConfigError(f"RuntimeConfig.device='{self.device}': {there}", f"--device {self.device}: {there}")
        if self.threads is not None and not 0 < self.threads <= MAX_THREADS:
            raise LongswiftError(f"--threads must be between 1 and {MAX_THREADS}; got {self.threads}")
        if self.cuda_graphs not in ("auto", "on", "off"):
            raise LongswiftError(f"--cuda-graphs must be auto, on or off; got '{self.cuda_graphs}'")
        if self.cuda_graphs == "on" and (self.device == "cpu" or not _cuda()):
            raise ConfigError("RuntimeConfig.cuda_graphs='on' needs a CUDA device: use cuda_graphs='auto' or 'off' here",
                              "--cuda-graphs on needs a CUDA device: use --cuda-graphs auto or off here")
        if self.triton_kernels and self.device == "cpu":
            raise ConfigError("RuntimeConfig.triton_kernels needs a CUDA device: leave it off on a CPU",
                              "--triton-kernels needs a CUDA device: leave it off with --device cpu")
        if self.graph_attention not in ("auto", *GRAPH_ATTENTIONS):
            raise LongswiftError(f"--graph-attention must be one of auto, {', '.join(GRAPH_ATTENTIONS)}; "
                                 f"got '{self.graph_attention}'")
        if self.read_every < 0:
            raise LongswiftError(f"--read-every must be 0 (auto) or a positive number of tokens; got {self.read_every}")
        if self.rope_scaling is not None:
            parse_rope_scaling(self.rope_scaling)

    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if _cuda() else "cpu")
        return torch.device(self.device)

    def token_block(self, device: torch.device) -> int:
        """--read-every resolved for the device the model runs on."""
        return self.read_every or (READ_EVERY_CUDA if device.type == "cuda" else 1)

    def torch_dtype(self) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return getattr(torch, self.dtype)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()
