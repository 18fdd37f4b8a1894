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
    --max-new-tokens fits its context (20000 was refused as beyond its 8,192 tokens)."""
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
        if args.resume is None:
            assert 1 + args.max_new_tokens <= context, example


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


def test_gpu_targets_summary_gives_session_28s_verdicts(tmp_path):
    """The targets' summary that a GPU session's one call ends with (gpu_session.sh first), on the files
    session 28 measured on an H100: the figures and verdicts docs/benchmarks.md states for them."""
    import shutil

    s28 = ROOT / "docs" / "bench" / "gpu" / "session28-h100"
    (tmp_path / "cell").mkdir()
    for name in ("steps-length.json", "ar-smollm2-135m.txt", "tests.txt"):
        shutil.copy(s28 / name, tmp_path / name)
    rows = target_rows(issue16_targets().report(tmp_path))  # no cell yet: the shape's AR is the proxy
    assert rows["tests/test_cuda.py, test_attention.py, test_cuda_graphs.py pass on the GPU"][1] == "**met**"
    assert rows["AR step >= 70% of the bandwidth floor at 4K"] == ("66% at 4,096 (7.93 ms, floor 5.26 ms)",
                                                                   "**not met**")
    assert rows["AR step >= 70% of the bandwidth floor at 100K"][1] == "**met**"
    assert rows["default verify pass at 100K <= 1.3x an AR step"] == ("1.35x at 100,000 (32 nodes: 16.29 ms)",
                                                                      "**not met**")
    assert rows["100K new tokens after 4K at alpha 0.8 projected under 10 min"][0].startswith("8.9 min")
    assert rows["embedded model AR >= 296 tok/s (5x 59.2)"][0].startswith("571.8 tok/s on the shape")
    assert rows["TokenSwift >= 0.97x AR in every bench cell"][1] == "not measured"
    shutil.copy(s28 / "embedded" / "results.csv", tmp_path / "cell" / "results.csv")
    rows = target_rows(issue16_targets().report(tmp_path))
    assert rows["embedded model AR >= 296 tok/s (5x 59.2)"] == (
        "473.0 tok/s (the slowest of 2 cells: paper, 2048+4096)", "**met**")
    assert rows["TokenSwift >= 0.97x AR in every bench cell"] == (
        "slowest 0.95x (tokenswift paper 2048+4096; 4 cells)", "**not met**")
    (tmp_path / "tests.txt").write_text("...F\n1 failed, 150 passed in 30.1s\n")
    assert target_rows(issue16_targets().report(tmp_path))[
        "tests/test_cuda.py, test_attention.py, test_cuda_graphs.py pass on the GPU"][1] == "**not met**"


def test_gpu_targets_summary_reads_what_bench_steps_writes_now(tmp_path, capsys, monkeypatch):
    """The summary reads the JSON of today's bench-steps (a tiny shape on the CPU), not only session 28's,
    and says 'not measured' for what is missing rather than failing."""
    from conftest import run_cli
    from test_bench_steps import TINY, TINY_RUN

    from longswift.bench.shapes import SHAPES

    monkeypatch.setitem(SHAPES, "tiny", TINY)
    code, _, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64,256", "--alpha", "0.8", "--tree-nodes",
                           "1,4,7", "--prefix", "100", "--new-tokens", "150",
                           "--json", str(tmp_path / "steps-length.json"))
    assert code == 0, err
    rows = target_rows(issue16_targets().report(tmp_path))
    for target in ("AR step >= 70% of the bandwidth floor at 4K", "default verify pass at 100K <= 1.3x an AR step",
                   "100K new tokens after 4K at alpha 0.8 projected under 10 min"):
        assert rows[target][1] in ("**met**", "**not met**"), rows[target]
    share = rows["AR step >= 70% of the bandwidth floor at 4K"][0]
    assert re.fullmatch(r"\d+% at 256 \([\d.]+ ms, floor [\d.]+ ms\)", share), share
    assert rows["embedded model AR >= 296 tok/s (5x 59.2)"][1] == "not measured"


def test_gpu_session_script_parses_and_knows_its_first_parts():
    import subprocess

    script = ROOT / "docs" / "scripts" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    first = re.search(r'for entry in (.*?); do', text).group(1)
    parts = {p.strip('"').split()[0] for p in re.findall(r'"[^"]+"', first)}
    assert parts == {"tests", "steps", "ar"}
    for part in parts:
        assert re.search(rf"^  {part}\)", text, flags=re.M), part
