"""A pytest plugin that runs tests/test_cuda.py on the fake CUDA device (tests/fake_cuda.py), for a machine
without a GPU: `python -m pytest -p fake_cuda_run tests/test_cuda.py` with tests/ on PYTHONPATH
(tests/test_fake_cuda.py does it). The GPU tests are skipped everywhere CI runs, so nothing else would notice
when a change to the package breaks their own code (a renamed argument, a helper that moved): here each
test's code runs until one of its checks of values, which the fake device cannot give (its reads answer
zeros), so a test passes or fails at an `assert` in test_cuda.py; any other error is code that would fail on
the GPU too (or a gap of the fake device, mended here).

What it adds to fake_cuda: torch.cuda.is_available() is True from the start (test_cuda.py's skip mark reads
it as the module is collected); a generator asked for on CUDA is a CPU one (fake tensors draw nothing);
torch.equal and torch.testing.assert_close pass where a fake tensor is involved (no values to compare);
the allocator's statistics read zero; the profiler records no kernels; the Triton kernels (--triton-kernels)
launch nothing, their wrappers' checks and allocations running as on a GPU. Each test's outcome goes as a JSON
line to the file named by $FAKE_CUDA_REPORT: its id, the phase (setup, call, teardown), the outcome, a skip's
reason, and for a failure the exception's type and the innermost frame of its traceback (the file relative
to the repository, the line)."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import pytest
import torch

# Modules that name torch.cuda.CUDAGraph in annotations evaluated at import, which the fake device replaces
# with a function while a test runs: imported first (transformers imports them lazily, when test_cuda.py builds
# its first tiny model).
import transformers.generation.utils
import transformers.modeling_utils  # noqa: F401
from fake_cuda_parts import part_of
from torch._subclasses.fake_tensor import FakeTensor

ROOT = Path(__file__).resolve().parents[1]
torch.cuda.is_available = lambda: True
_generator, _equal, _assert_close = torch.Generator, torch.equal, torch.testing.assert_close


def _fake(*xs: object) -> bool:
    return any(isinstance(x, FakeTensor) for x in xs)


class _Profile:
    """torch.profiler.profile that records nothing (there are no kernels to see)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __enter__(self) -> _Profile:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def events(self) -> list:
        return []

    def key_averages(self) -> list:
        return []


class _Unlaunched:
    """A Triton kernel that launches nothing: `kernel[grid](*args)` returns (a fake tensor has no memory to pass)."""

    def __getitem__(self, grid: tuple) -> object:
        return lambda *args, **kwargs: None


class _UnlaunchedKernels:
    """runtime.triton_jit as the fake device sees it: kernels that launch nothing."""

    rope_store_kernel = silu_mul_kernel = rms_norm_kernel = _Unlaunched()
    attention_part_kernel = attention_merge_kernel = _Unlaunched()
    sample_prepare_kernel = sample_sums_kernel = sample_pick_kernel = _Unlaunched()
    libdevice = None


_UNLAUNCHED = _UnlaunchedKernels()


@pytest.fixture(autouse=True)
def _on_the_fake_device(monkeypatch):
    from fake_cuda import fake_cuda

    monkeypatch.setattr(torch, "Generator", lambda device="cpu": _generator())
    monkeypatch.setattr(torch, "equal", lambda a, b: True if _fake(a, b) else _equal(a, b))
    monkeypatch.setattr(torch.testing, "assert_close",
                        lambda a, b, **k: None if _fake(a, b) else _assert_close(a, b, **k))
    for name in ("reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: 0)
    monkeypatch.setattr(torch.profiler, "profile", _Profile)
    from longswift.runtime import triton_kernels

    monkeypatch.setattr(triton_kernels, "kernels", lambda: _UNLAUNCHED)
    with fake_cuda(monkeypatch):
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With $FAKE_CUDA_ONE_EACH set, the first parametrization of each test function alone: each function's
    code, in a fraction of the time (the fake device runs every op's meta kernel, ~0.2 ms an op on a CPU).
    With $FAKE_CUDA_PART set to 'I/N' as well, the functions whose place in the module (from 0) is I modulo N:
    one of N parts, which CI's workers run side by side (see part_of)."""
    if os.environ.get("FAKE_CUDA_ONE_EACH"):
        seen: set[str] = set()
        kept = [item for item in items if not (item.originalname in seen or seen.add(item.originalname))]
        part = os.environ.get("FAKE_CUDA_PART")
        if part:
            mine = set(part_of([item.originalname for item in kept], part))
            kept = [item for item in kept if item.originalname in mine]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" and report.passed:
        return
    line: dict[str, object] = {"id": report.nodeid, "when": report.when, "outcome": report.outcome}
    if report.skipped and isinstance(report.longrepr, tuple):
        line["reason"] = report.longrepr[2]
    excinfo = getattr(report, "_fake_excinfo", None)
    if excinfo is not None:
        frame = traceback.extract_tb(excinfo.tb)[-1]
        where = Path(frame.filename).resolve()
        line["error"] = excinfo.typename
        line["where"] = f"{where.relative_to(ROOT) if where.is_relative_to(ROOT) else where}:{frame.lineno}"
    path = os.environ.get("FAKE_CUDA_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    report._fake_excinfo = call.excinfo
    return report
