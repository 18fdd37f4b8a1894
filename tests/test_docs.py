"""The README's promises that can be checked mechanically."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def test_quickstart_has_exactly_two_commands():
    commands = quickstart_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)
    assert "longswift generate" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert quickstart_commands()[1] in ci


def test_readme_flags_exist():
    """Every flag in the README's synopsis is a flag of the command whose lines it is on."""
    from longswift.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    readme = (ROOT / "README.md").read_text()
    usage = readme.split("## Command line", 1)[1].split("```", 2)[1]
    command, seen = None, set()
    for line in usage.splitlines():
        started = re.match(r"longswift (\S+)", line)
        if started:
            command = started.group(1)
        options = (commands[command] if command in commands else parser)._option_string_actions
        seen.add(command)
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line.split(" #")[0]):
            assert flag in options, f"longswift {command}: {flag}"
    assert set(commands) <= seen, f"commands missing from the synopsis: {set(commands) - seen}"


def test_every_on_off_flag_takes_its_other_form():
    """README: every on/off flag also takes its other form, which states the default (`--lockstep` and
    `--no-lockstep`, `--no-progress` and `--progress`); the last given wins. Not switches: --debug (tracebacks, a
    global flag), generate's --greedy (shorthand for --temperature 0) and train-heads' --resume (an action)."""
    import argparse

    from longswift.cli import build_parser

    not_switches = {"debug", "greedy", "resume"}
    commands = build_parser()._subparsers._group_actions[0].choices
    for name, command in commands.items():
        actions = [a for a in command._actions if a.option_strings and a.dest not in not_switches]
        for action in actions:
            if isinstance(action, argparse.BooleanOptionalAction):
                continue
            if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                others = [a for a in actions if a.dest == action.dest and a.const is not action.const]
                assert others, f"longswift {name} {action.option_strings[0]} has no other form"
    parse = build_parser().parse_args
    bench = parse(["bench", "--lockstep", "--no-lockstep", "--warmup", "--progress", "--fresh", "--no-fresh",
                   "--chat", "--no-chat"])
    assert (bench.lockstep, bench.no_warmup, bench.no_progress, bench.fresh, bench.chat) == (False,) * 5
    assert parse(["bench", "--no-warmup", "--no-progress"]).no_warmup is True
    assert parse(["generate", "--prompt", "x", "--no-progress", "--progress"]).no_progress is False
    for heads in (["train-heads", "--out", "d"], ["eval-heads", "--heads", "default"]):
        assert parse([*heads, "--progress"]).no_progress is False
        assert parse([*heads, "--progress", "--no-progress"]).no_progress is True


def test_readme_names_every_json_stats_field():
    """`generate --json` writes GenerationStats.to_dict(): the README's command-line section names
    each of its keys, so a field added to the stats is not left undocumented."""
    from longswift.stats import GenerationStats

    section = (ROOT / "README.md").read_text().split("## Command line", 1)[1].split("\n## ", 1)[0]
    # the description itself, not any mention elsewhere in the section
    described = section.split("`--json FILE` writes", 1)[1].split("Every run's JSON holds all", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", described))
    missing = sorted(set(GenerationStats(method="ar", prompt_tokens=1).to_dict()) - named)
    assert not missing, f"README's --json description does not name {missing}"


def test_generate_help_examples_fit_the_default_model():
    """The examples in `generate --help` run on the embedded model: they parse, and their
    --max-new-tokens fits its context (20000 was refused as beyond its 8,192 tokens; so was a resume's
    12000, which no resume can rescale), with a 1,000-token prompt file."""
    import shlex

    from longswift.cli import build_parser
    from longswift.runtime.loading import load_config

    parser = build_parser()
    help_text = parser._subparsers._group_actions[0].choices["generate"].format_help()
    examples = re.findall(r"^  longswift (generate .*)$", help_text.split("examples:", 1)[1], flags=re.M)
    assert examples
    context = load_config(None).context_limit
    for example in examples:
        args = parser.parse_args(shlex.split(example))
        if args.max_new_tokens is not None:  # (a resume without it keeps the checkpoint's length)
            assert (1000 if args.prompt_file else 1) + args.max_new_tokens <= context, example


def test_doc_scripts_import_what_the_package_has():
    """docs/scripts run on a lent GPU, where a name lost in a refactor would cost a device call:
    every `from longswift... import` in them must resolve."""
    import ast
    import importlib

    scripts = sorted((ROOT / "docs" / "scripts").glob("*.py"))
    assert scripts
    for script in scripts:
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "longswift":
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                        f"{script.name}: {node.module} has no {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "longswift":
                        importlib.import_module(alias.name)


def issue16_targets():
    """docs/scripts/issue16_targets.py as a module (scripts are not a package)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("issue16_targets", ROOT / "docs" / "scripts" / "issue16_targets.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def target_rows(text: str) -> dict[str, tuple[str, str]]:
    """The summary's table -> {target: (measured, verdict)}."""
    rows = [line.strip("|").split(" | ") for line in text.splitlines()[2:]]
    return {r[0].strip(): (r[1], r[2]) for r in rows}


S28 = ROOT / "docs" / "bench" / "gpu" / "session28-h100"
TESTS = "tests/test_cuda.py, test_attention.py, test_cuda_graphs.py pass on a GPU"
FLOOR_4K, FLOOR_100K = "AR step >= 70% of the bandwidth floor at 4K", "AR step >= 70% of the bandwidth floor at 100K"
VERIFY = "default verify pass at 100K <= 1.3x an AR step"
PROJECTED = "100K new tokens after 4K at alpha 0.8 projected under 10 min"
EMBEDDED_AR = "embedded model AR >= 5x the issue's start (59.2 tok/s greedy)"
SLOWEST = "TokenSwift >= 0.97x AR in every bench cell"


def test_gpu_targets_summary_gives_session_28s_verdicts(tmp_path):
    """The targets' summary that a GPU session's one call ends with (gpu_session.sh first), on the files
    session 28 measured on an H100: the figures and verdicts docs/benchmarks.md states for them."""
    import shutil

    (tmp_path / "cell").mkdir()
    for name in ("steps-length.json", "ar-smollm2-135m.txt", "tests.txt", "versions.txt"):
        shutil.copy(S28 / name, tmp_path / name)
    rows = target_rows(issue16_targets().report(tmp_path))  # no cell yet: the shape's AR is the proxy
    assert rows[TESTS][1] == "**met**"
    assert rows[FLOOR_4K] == ("66% at 4,096 (7.93 ms, floor 5.26 ms)", "**not met**")
    assert rows[FLOOR_100K][1] == "**met**"
    assert rows[VERIFY] == ("1.35x at 100,000 (32 nodes: 16.29 ms)", "**not met**")
    assert rows[PROJECTED] == ("8.9 min (AR 16.8 min)", "**met**")
    assert rows[EMBEDDED_AR][0].startswith("571.8 tok/s greedy on the shape")
    assert rows[SLOWEST][1] == "not measured"
    with (tmp_path / "ar-smollm2-135m.txt").open("a") as f:  # opt-in Triton kernels' runs: not the default's median
        f.write(("smollm2-135m layers=30 bfloat16 prompt=2048 new=1024 cuda_graphs=on read_every=16 "
                 "graph_attention=length colocated=True fused_norm=True fused_residual=True fused_rope=True "
                 "triton_kernels=True: decode 9999.0 tok/s (0.10 ms/token), prefill 0.17 s, 1 graphs captured in "
                 "0.05 s\n") * 5)
    assert target_rows(issue16_targets().report(tmp_path))[EMBEDDED_AR][0].startswith("571.8 tok/s greedy")
    shutil.copy(S28 / "embedded" / "results.jsonl", tmp_path / "cell" / "results.jsonl")
    rows = target_rows(issue16_targets().report(tmp_path))
    assert rows[EMBEDDED_AR] == ("greedy 547.7 tok/s (9.3x 59.2); paper 473.0 tok/s (10.4x 45.5)", "**met**")
    assert rows[SLOWEST] == ("slowest 0.95x (tokenswift paper 2048+4096; 4 method-cells)", "**not met**")
    (tmp_path / "tests.txt").write_text("...F\n1 failed, 150 passed in 30.1s\n")
    assert target_rows(issue16_targets().report(tmp_path))[TESTS][1] == "**not met**"
    (tmp_path / "tests.txt").write_text("151 passed, 79 skipped in 30.1s\n")  # the CUDA module skipped: no GPU
    (tmp_path / "versions.txt").write_text("torch 2.13.0+cpu (no CUDA)\n")
    assert target_rows(issue16_targets().report(tmp_path))[TESTS][1] == "**not met**"


def test_gpu_targets_summary_reads_what_bench_steps_writes_now(tmp_path, capsys, monkeypatch):
    """The summary reads the JSON of today's bench-steps (a tiny shape on the CPU at the targets' sizes, 4K and
    100K context), not only session 28's, and says 'not measured' for sizes the targets do not name."""
    from conftest import run_cli
    from test_bench_steps import TINY, TINY_RUN

    from longswift.bench.shapes import SHAPES

    monkeypatch.setitem(SHAPES, "tiny", {**TINY, "max_position_embeddings": 131072})
    code, _, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "4096,100000", "--alpha", "0.8",
                           "--tree-nodes", "1,4,7", "--new-tokens", "100000", "--json", str(tmp_path / "steps-length.json"))
    assert code == 0, err
    rows = target_rows(issue16_targets().report(tmp_path))
    for target in (FLOOR_4K, FLOOR_100K, VERIFY, PROJECTED):
        assert rows[target][1] in ("**met**", "**not met**"), rows[target]
    assert re.fullmatch(r"\d+% at 4,096 \([\d.]+ ms, floor [\d.]+ ms\)", rows[FLOOR_4K][0]), rows[FLOOR_4K]
    assert rows[EMBEDDED_AR][1] == "not measured" and rows[TESTS][1] == "not measured"
    code, _, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64,256", "--alpha", "0.8", "--prefix",
                           "100", "--new-tokens", "150", "--json", str(tmp_path / "steps-length.json"))
    assert code == 0, err
    rows = target_rows(issue16_targets().report(tmp_path))
    assert all(rows[t][1] == "not measured" for t in (FLOOR_4K, FLOOR_100K, VERIFY, PROJECTED)), rows
    assert rows[FLOOR_4K][0] == "no context near 4,096 (measured: 64, 100, 128, 250, 256)"


def test_gpu_session_first_runs_its_parts_within_the_budget(tmp_path):
    """`gpu_session.sh first` with a stand-in for the GPU machine's python (its parts' commands answered
    with session 28's files): every part runs, the files come back packed with the targets' table; with a
    budget too small for more, later parts are skipped and said to be, and the table still comes."""
    import os
    import subprocess
    import sys
    import tarfile
    import time

    stub = tmp_path / "python"
    stub.write_text(f"""#!/usr/bin/env bash
case "$1" in
  -) cat > /dev/null; echo "torch 2.11.0 NVIDIA H100 80GB HBM3 (stand-in)" ;;
  -m) case "$2" in
        pytest) sleep "${{STUB_SLEEP:-0}}"; echo "151 passed in 1.0s" ;;
        longswift) while [ $# -gt 0 ]; do [ "$1" = --json ] && cp {S28}/steps-length.json "$2"; shift; done ;;
      esac ;;
  docs/scripts/gpu_ar_throughput.py) sleep "${{STUB_AR_SLEEP:-0}}"; cat {S28}/ar-smollm2-135m.txt ;;
  *) exec {sys.executable} "$@" ;;
esac
""")
    stub.chmod(0o755)

    def env(out, budget, sleep=0, ar_sleep=0):
        return {**os.environ, "PYTHON": str(stub), "OUT": str(out), "BUDGET": str(budget), "STUB_SLEEP": str(sleep),
                "STUB_AR_SLEEP": str(ar_sleep), "PYTHONPATH": str(ROOT / "src"),
                "PARTS_DIR": str(tmp_path / f"{out.name}-work" / "parts")}

    def first(out, budget, sleep=0):
        done = subprocess.run(["bash", "docs/scripts/gpu_session.sh", "first"], cwd=ROOT, env=env(out, budget, sleep),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return (out / "first.log").read_text(), target_rows((out / "targets.md").read_text())

    log, rows = first(tmp_path / "all", 420)
    assert [line.split("'")[1] for line in log.splitlines()] == ["tests", "ar smollm2 targets", "steps length",
                                                                 "steps triton", "attention", "sampling", "steps fused"]
    assert "exited 0" in log and "skipped" not in log and "cut off" not in log
    assert rows[TESTS][1] == rows[FLOOR_100K][1] == rows[EMBEDDED_AR][1] == "**met**"
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == ["first.log", "parts.tar.gz", "targets.md",
                                                                     "versions.txt"]  # the device tool returns 8
    with tarfile.open(tmp_path / "all" / "parts.tar.gz") as tar:
        assert {"parts/tests.txt", "parts/steps-length.json", "parts/steps-triton.json",
                "parts/ar-smollm2-135m.txt", "parts/triton-attention-ab.md",
                "parts/triton-sampling-ab.md"} <= set(tar.getnames())
    assert rows[FLOOR_4K + " (--triton-kernels)"] == rows[FLOOR_4K]  # (the stand-in's same file for both)
    log, rows = first(tmp_path / "short", 46, sleep=3)  # 31 s left before the tests, under 30 after them
    assert "first: 'tests' exited 0" in log and "first: skipped 'ar" in log and "skipped 'steps fused'" in log
    assert rows[TESTS][1] == "**met**" and rows[FLOOR_4K][1] == "not measured"
    # A call cut off mid-way (the device tool's timeout) keeps the parts done so far in the one file it returns
    cut = tmp_path / "cut"
    run = subprocess.Popen(["bash", "docs/scripts/gpu_session.sh", "first"], cwd=ROOT, env=env(cut, 420, ar_sleep=60),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 60
    while "'tests' exited" not in ((cut / "first.log").read_text() if (cut / "first.log").exists() else "") \
            and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # (in the ar part's sleep)
    run.terminate()
    assert run.wait(timeout=60) == 143
    with tarfile.open(cut / "parts.tar.gz") as tar:
        assert "parts/tests.txt" in tar.getnames()


def test_gpu_session_script_parses_and_knows_its_first_parts():
    import subprocess

    script = ROOT / "docs" / "scripts" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    parts = set(re.findall(r"^    run_part \d+ (\w+)", text, flags=re.M))
    assert parts == {"tests", "steps", "ar", "attention", "sampling"}
    for part in parts:
        assert re.search(rf"^  {part}\)", text, flags=re.M), part
