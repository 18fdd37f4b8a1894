"""How the fake-device run of tests/test_cuda.py is split into parts (tests/test_fake_cuda.py runs each part in a
subprocess; tests/fake_cuda_run.py, the plugin there, keeps one part's functions). A module of its own because
fake_cuda_run replaces torch.cuda.is_available as it is imported: imported into a test worker for this helper,
it made every later test on that worker take CUDA for present (CI: 140 failed, 247 errors)."""

from __future__ import annotations


def part_of(functions: list[str], part: str) -> list[str]:
    """The test functions (in the module's order) that part 'I/N' runs: every N-th from the I-th."""
    index, parts = (int(x) for x in part.split("/"))
    return functions[index::parts]
