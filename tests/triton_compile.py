"""Triton's compiler run on the CPU for an NVIDIA GPU (the wheel brings LLVM and ptxas): what the kernels' tests
use to catch GPU-only failures (a type the compiler refuses, shared memory past a GPU's) without a GPU."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton


def compile_for(fn, target: int, signature: dict[str, str], params: dict, ones: tuple[str, ...] = (),
                aligned: tuple[str, ...] = ()):
    """Triton's compiler, run here for an NVIDIA GPU of compute capability `target` (no GPU needed: the wheel
    brings LLVM and ptxas) -> the compiled kernel (its PTX, its shared memory). As a launch specializes them:
    `ones`, integer arguments equal to 1 (a unit stride: constants), and `aligned`, pointers and integers
    divisible by 16 (which is what lets Triton vectorise and pipeline the loads)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    options = {k: params.pop(k) for k in ("num_warps", "num_stages", "enable_fp_fusion") if k in params}
    params = {**params, **dict.fromkeys(ones, 1)}
    signature = {**signature, **{name: "constexpr" for name in params}}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=params, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", target, 32), options=options)


# The shared memory a thread block may take: sm_86 and sm_89 (RTX 30x0/40x0, L4, L40) 99 KB; an A100 163 KB; an
# H100 or H200 227 KB.
SHARED_LIMIT = {86: 99 * 1024, 80: 163 * 1024, 90: 227 * 1024}


def spilled_bytes(kernel, target: int) -> int:
    """The bytes a thread of `kernel` (as compile_for returns it for `target`) stores to local memory because its
    registers ran out, as ptxas -v reports them for the kernel's PTX (Triton's own ptxas for that target): the
    cost a GPU would show as time, found without one."""
    from triton.backends.nvidia.compiler import get_ptxas

    arch = f"sm_{target}a" if target >= 90 else f"sm_{target}"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(kernel.asm["ptx"])
        report = subprocess.run([get_ptxas(target).path, f"-arch={arch}", "-v", str(ptx), "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr
    stores = re.findall(r"(\d+) bytes spill stores", report)
    assert stores, report
    return sum(map(int, stores))
