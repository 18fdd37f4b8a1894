"""A CUDA device for machines without one: tensors on "cuda" are fake (torch's FakeTensorMode: shape,
dtype and device only, each op checked by its meta kernel, including that its tensors share a device),
while host tensors and host code stay real. The CUDA branches of the model, the attention backends, the
step bodies and the generation loops then run on a CPU-only CI machine, at real model shapes (fake
weights take no memory), and the host's reads of device memory are recorded where they happen: values
(tolist, item, int, bool, float), copies to the host (cpu(), to("cpu"), numpy()) and copies into host
tensors (copy_, assignment), each answered with zeros.

What it cannot check: values (a read answers zeros), kernel limits that only the CUDA kernels enforce
(head sizes, alignment), CUDA graph capture, and speed: tests/test_cuda.py does that on a GPU.

The Python bindings that reach CUDA's device guard, which a CPU build of torch lacks, are routed to the
aten ops beneath them: indexing (`t[...]`, `t[...] = v`), `~t`, `contiguous()`, `torch.tensor(device=)`
and host-to-device copies."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

CUDA = torch.device("cuda")
PACKAGE = str(Path(__file__).resolve().parents[1] / "src" / "longswift")


@dataclass(frozen=True)
class Read:
    """One read of device memory by the host: the call (tolist, item, int, ...), the tensor's shape,
    and the package function and line that made it; `capturing`: made while a CUDA graph was being
    captured (on a GPU, an error: a capture may not wait for the device)."""

    call: str
    shape: tuple[int, ...]
    where: str  # "function:line" of the innermost frame in src/longswift
    capturing: bool = False


def _caller() -> str:
    frames = [f for f in traceback.extract_stack() if f.filename.startswith(PACKAGE)]
    return f"{frames[-1].name}:{frames[-1].lineno}" if frames else "?"


def _on_cuda(x: object) -> bool:
    if not isinstance(x, (str, torch.device)):
        return False
    try:
        return torch.device(x).type == "cuda"
    except RuntimeError:
        return False


def _to_host(args: tuple, kwargs: dict) -> bool:
    """Whether Tensor.to(*args, **kwargs) names the CPU as its device."""
    device = kwargs.get("device", next((a for a in args if isinstance(a, (str, torch.device))), None))
    return device is not None and torch.device(device).type == "cpu"


def _index(x: torch.Tensor, key: object) -> torch.Tensor:
    """x[key] through aten ops: ints, slices (any step), None, Ellipsis and tensor indices (advanced
    indexing, the indexed dimensions first as aten.index puts them when adjacent)."""
    key = key if isinstance(key, tuple) else (key,)
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    parts: list[object] = []
    for k in key:
        parts.extend([slice(None)] * (x.dim() - used) if k is Ellipsis else [k])
    dim, tensors = 0, {}
    for k in parts:
        if k is None:
            x = torch.ops.aten.unsqueeze(x, dim)
            dim += 1
        elif isinstance(k, slice):
            start, stop, step = k.indices(x.shape[dim])
            x = torch.ops.aten.slice(x, dim, start, max(start, stop), step)
            dim += 1
        elif isinstance(k, torch.Tensor):
            tensors[dim] = k
            dim += 1
        elif isinstance(k, int):
            x = torch.ops.aten.select(x, dim, k)
        else:
            raise NotImplementedError(f"fake CUDA indexing by {k!r}")
    if tensors:
        x = torch.ops.aten.index(x, [tensors.get(d) for d in range(max(tensors) + 1)])
    return x


READS = {torch.Tensor.item: "item", torch.Tensor.__int__: "int", torch.Tensor.__bool__: "bool",
         torch.Tensor.__float__: "float", torch.Tensor.__index__: "index"}


class FakeCuda(TorchFunctionMode):
    """Host code real, device code fake; `reads` records the host's reads of device memory, each
    answered with zeros."""

    def __init__(self, fake_mode: FakeTensorMode) -> None:
        super().__init__()
        self.fake_mode = fake_mode
        self.reads: list[Read] = []
        self.capturing = False  # inside torch.cuda.graph (FakeGraphs)
        self.captured: list[FakeGraph] = []
        self.replays = 0

    def record(self, call: str, x: torch.Tensor) -> None:
        self.reads.append(Read(call, tuple(x.shape), _caller(), self.capturing))

    def to_host(self, call: str, x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A copy of device memory to the host: recorded, answered with zeros (a real CPU tensor)."""
        self.record(call, x)
        with unset_fake_temporarily():
            zeros = torch.zeros(x.shape, dtype=dtype or x.dtype)
            return zeros.numpy() if call == "numpy" else zeros

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        if not any(isinstance(a, FakeTensor) or _on_cuda(a) for a in flat):
            with unset_fake_temporarily():  # the host's own work: real tensors, real values
                return func(*args, **kwargs)
        if func is torch.tensor:  # made on the host, then copied (made on the device, it fails in inference mode)
            with unset_fake_temporarily():
                host = func(*args, **{k: v for k, v in kwargs.items() if k != "device"})
            return torch.ops.aten._to_copy(self.fake_mode.from_tensor(host), device=CUDA)
        if func in READS and isinstance(args[0], FakeTensor):
            self.record(READS[func], args[0])
            return {torch.Tensor.__bool__: False, torch.Tensor.__float__: 0.0}.get(func, 0)
        if func in (torch.Tensor.cpu, torch.Tensor.to, torch.Tensor.numpy) and isinstance(args[0], FakeTensor):
            if func is not torch.Tensor.to or _to_host(args[1:], kwargs):  # the device's values to the host
                dtype = kwargs.get("dtype", next((a for a in args[1:] if isinstance(a, torch.dtype)), None))
                return self.to_host(func.__name__, args[0], dtype)
        if func is torch.Tensor.__getitem__:
            return _index(args[0], args[1])
        if func is torch.Tensor.__setitem__:
            target, key, value = args
            if isinstance(value, FakeTensor) and not isinstance(target, FakeTensor):  # into a host tensor
                self.to_host("setitem", value)
                with unset_fake_temporarily():
                    target[key] = 0
                return None
            view = _index(target, key)
            if isinstance(value, torch.Tensor):
                torch.ops.aten.copy_(view, value.expand_as(view))
            else:
                torch.ops.aten.fill_(view, value)
            return None
        if func is torch.Tensor.__invert__:
            return torch.ops.aten.bitwise_not(args[0])
        if func is torch.Tensor.contiguous:
            x = args[0]
            return x if x.is_contiguous() else torch.ops.aten.clone(x, memory_format=torch.contiguous_format)
        if func is torch.Tensor.copy_:
            if isinstance(args[1], FakeTensor) and not isinstance(args[0], FakeTensor):  # into a host tensor
                self.to_host("copy_", args[1])
                with unset_fake_temporarily():
                    return args[0].zero_()
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            return torch.ops.aten.copy_(args[0], args[1], bool(non_blocking))
        if func in (torch.Tensor.to, torch.Tensor.cuda) and not isinstance(args[0], FakeTensor):
            x, device, dtype = args[0], kwargs.get("device"), kwargs.get("dtype")
            for a in args[1:]:
                if isinstance(a, (str, torch.device)):
                    device = a
                elif isinstance(a, torch.dtype):
                    dtype = a
            if func is torch.Tensor.cuda or _on_cuda(device):  # a host tensor to the device
                return torch.ops.aten._to_copy(self.fake_mode.from_tensor(x), dtype=dtype or x.dtype, device=CUDA)
        return func(*args, **kwargs)


class FakeGraph:
    """torch.cuda.CUDAGraph's stand-in: capture runs the body once (as a capture does, whose outputs are
    the graph's static tensors), replay runs nothing (the static outputs keep their shapes, and fake
    tensors have no values to update)."""

    def __init__(self, mode: FakeCuda) -> None:
        self.mode = mode

    def replay(self) -> None:
        assert self in self.mode.captured, "replay of a graph that was never captured"
        self.mode.replays += 1


class FakeStream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, other: FakeStream) -> None:
        pass


def _fake_graphs(monkeypatch, mode: FakeCuda) -> None:
    """torch.cuda's graph capture, streams and device contexts for the fake device: captures are counted,
    and a host read during one is marked (Read.capturing)."""

    @contextlib.contextmanager
    def graph(g: FakeGraph, pool: object = None, stream: object = None) -> Iterator[None]:
        mode.capturing = True
        try:
            yield
        finally:
            mode.capturing = False
        mode.captured.append(g)

    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: FakeGraph(mode))
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())


@contextlib.contextmanager
def fake_cuda(monkeypatch) -> Iterator[FakeCuda]:
    """Run the block with the fake device (torch.inference_mode, as generation runs). torch.cuda
    answers as for one device of compute capability 9.0 with 80 GiB free, synchronize does nothing, and
    graphs are FakeGraphs (captured by running the body; replays counted); CUDA generators stay unavailable."""
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    mode = FakeCuda(fake_mode)

    def tolist(self: FakeTensor) -> list:
        mode.record("tolist", self)
        with unset_fake_temporarily():
            return torch.zeros(self.shape, dtype=self.dtype).tolist()

    monkeypatch.setattr(FakeTensor, "tolist", tolist, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a, **k: (80 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    # an H100's or H200's 132 multiprocessors (the Triton attention's part count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: SimpleNamespace(multi_processor_count=132))
    # A fake "cuda" tensor's first construction makes a real one to set up the device (torch 2.11 does when
    # torch.cuda.is_available(), patched above): on a CUDA build of torch without a GPU that raised "Found no
    # NVIDIA driver"; fake tensors need no device.
    monkeypatch.setattr(fake_tensor, "init_gpu_context", lambda device: None)
    _fake_graphs(monkeypatch, mode)
    # Caches of device facts and tensors (the ban's index tensor, flash's capability) are emptied before and
    # after: a fake tensor or a fake capability must not outlive the block (on a GPU machine, later tests
    # would get them).
    from longswift.runtime.attention import _flash_capable
    from longswift.runtime.triton_kernels import _processors
    from longswift.sampling import banned_index

    caches = (banned_index, _flash_capable, _processors)
    for cache in caches:
        cache.cache_clear()
    try:
        with fake_mode, mode, torch.inference_mode():
            yield mode
    finally:
        for cache in caches:
            cache.cache_clear()


def fake_state(names_shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A state dict of fake CUDA tensors (call inside fake_cuda): an untied LM head shares the
    embedding, as bench-steps' random models do."""
    state = {name: torch.ones(shape, dtype=dtype, device=CUDA) for name, shape in names_shapes.items()
             if name != "lm_head.weight"}
    if "lm_head.weight" in names_shapes:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def fake_heads(hidden: int, gamma: int, eps: float, dtype: torch.dtype):
    """DraftHeads made on the fake device (call inside fake_cuda; nn.Module.to would swap a real
    parameter for a fake one, which torch refuses)."""
    from longswift.spec.heads import DraftHeads

    return DraftHeads(hidden, gamma, eps, None, "fake", device=CUDA, dtype=dtype).requires_grad_(False)
