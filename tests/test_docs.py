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
