"""What a report says of where it ran: the machine, the software versions and the commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def software_versions() -> dict[str, str | None]:
    """The software a run is measured with: the libraries' versions and longswift's git commit (None
    where a library is not installed or the package is not in a git checkout)."""
    from .peers import version

    found: dict[str, str | None] = {name: version(mod) for name, mod in (
        ("torch", "torch"), ("transformers", "transformers"), ("llama-cpp-python", "llama_cpp"),
        ("longswift", "longswift"))}
    found["commit"] = _git_commit()
    return found


def _versions_text(versions: dict[str, str | None]) -> str:
    commit = versions.get("commit")
    return (", ".join(f"{k} {v or 'not installed'}" for k, v in versions.items() if k != "commit")
            + (f" (commit {commit})" if commit else ""))


def versions_lines(records: list[dict[str, Any]] | None, versions: dict[str, str | None] | None = None) -> list[str]:
    """The report's versions line(s): the software of this invocation (`versions`, default: found now), or,
    for a results directory whose runs were measured by several invocations, the software each group of
    runs was measured with (records kept from before bench recorded it are counted as such)."""
    now = _versions_text(versions or software_versions())
    if not records:
        return [f"- versions: {now}"]
    groups: dict[str, int] = {}
    for r in records:
        text = _versions_text(r["versions"]) if r.get("versions") else None
        groups[text or ""] = groups.get(text or "", 0) + 1
    if list(groups) == [now]:
        return [f"- versions: {now}"]
    lines = ["- versions the runs were measured with:"]
    lines += [f"  - {text or 'not recorded (runs measured before bench kept versions)'}: {n} run{'s' * (n != 1)}"
              for text, n in groups.items()]
    return lines + [f"  - this report was written with: {now}"]


def cpu_features() -> str:
    """What tells two CPUs of one model name apart in a report: the vector instructions torch's kernels use
    (" (AVX2)", " (AVX512)"), and whether oneDNN has bfloat16 products there (session 48's AMD EPYC, AVX2 only,
    emulated bfloat16 5x slower than float32; sessions 32-37's, with AVX512-BF16, ran it 1.5x faster)."""
    import torch

    from ..runtime.linear import onednn_computes

    capability = torch.backends.cpu.get_cpu_capability()
    return f" ({capability}{'' if onednn_computes(torch.bfloat16) else ', no native bfloat16'})"


def _cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def processor_name(device: Any) -> str:
    """The processor a run's speed belongs to, kept in a results directory's identity: the GPU's name and
    memory on CUDA ("NVIDIA H200, 139 GiB"), else the CPU's model and what its kernels use."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        props = torch.cuda.get_device_properties(device)
        return f"{props.name}, {props.total_memory / 2**30:.0f} GiB"
    return f"{platform.machine()} {_cpu_model()}{cpu_features()}"


def machine_lines(identity: dict[str, Any], records: list[dict[str, Any]] | None = None,
                  versions: dict[str, str | None] | None = None) -> list[str]:
    """The report's lines on where its runs were measured: the processor its identity keeps (a directory made
    before it did: this machine's), the host (this machine, which is the measuring one unless the directory
    was copied), the software and the model."""
    mem = ""
    try:
        kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
        mem = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    host = f"{platform.machine()} {_cpu_model()}{cpu_features()}"
    processor = identity.get("processor") or host
    where = f"{processor}; host {host}, " if str(identity.get("device", "")).startswith("cuda") else f"{processor}, "
    every = identity.get("read_every")
    return [
        f"- machine: {where}{os.cpu_count()} logical CPUs{mem}; "
        f"{identity['threads']} torch threads; python {platform.python_version()}",
        *versions_lines(records, versions),
        f"- model: {identity['model']}, {identity['dtype']} on {identity['device']}, packed linears: "
        f"{identity['packed_linears']}{' (q/k/v and gate/up colocated)' if identity.get('colocated_linears') else ''}"
        f"{', fused kernels (RMSNorm, residual adds, rope)' if identity.get('fused_kernels') else ''}"
        f"{', float32 logits' if identity.get('float32_logits') else ''}"
        f"{', Triton kernels (rope with cache writes, SwiGLU)' if identity.get('triton_kernels') else ''}"
        f"{', graph attention ' + identity['graph_attention'] if identity.get('graph_attention') else ''}"
        f"{', rope scaling ' + identity['rope_scaling'] if identity.get('rope_scaling') else ''}"
        f"{', CUDA graphs off' if identity.get('cuda_graphs') is False else ''}"
        f"{f', AR reads its tokens {every} at a time (--read-every)' if every else ''}; "
        f"heads: {identity['heads']}",
    ]


def _git_commit(here: Path = Path(__file__).parent.parent) -> str | None:
    """The checkout's commit, with "-dirty" where the files under `here` (the package: changes elsewhere in the
    checkout do not change what ran) differ from it or are new (a report of a commit with uncommitted changes
    named the commit alone, as if it had measured it); None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5)
        commit = out.stdout.strip()
        if not commit:
            return None
        changed = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here,
                                 capture_output=True, text=True, timeout=5)
        return f"{commit}-dirty" if changed.returncode == 0 and changed.stdout.strip() else commit
    except (OSError, subprocess.SubprocessError):
        return None
