"""Write docs/cli.md, the CLI reference, from the commands' own help (their docstrings, arguments and options).

Run: ``.venv/bin/python scripts/cli_reference.py`` (``--check``: exit 1 if docs/cli.md is not what it would write;
tests/test_docs.py runs that). Nothing is written by hand in docs/cli.md: change a command's help, then run this.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path
from typing import Any

import typer

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from ingest.cli import app  # noqa: E402 - after the checkout is on the path

TARGET = REPO_ROOT / "docs" / "cli.md"
HEADER = """# CLI reference

Every `floe` command, its arguments and options, as `floe COMMAND --help` gives them (this page is generated
by `scripts/cli_reference.py` from the commands' own help; CI checks that it is current).

Global options come before the command: `floe [--root ROOT] [--config FILE] [-v] COMMAND ...`.
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _parameter_row(parameter: Any) -> str:
    if parameter.param_type_name == "argument":
        name = f"`{(parameter.metavar or parameter.name).upper()}`"
        text = getattr(parameter, "help", None) or ""
        required = "required" if parameter.required else "optional"
        return f"| {name} | {_cell(text)} ({required}) |"
    names = ", ".join(f"`{name}`" for name in [*parameter.opts, *parameter.secondary_opts])
    text = parameter.help or ""
    default = parameter.default
    shown = parameter.show_default is not False and default not in (None, False, (), []) and not parameter.is_flag
    if shown and not callable(default):
        text += f" (default: `{default}`)"
    return f"| {names} | {_cell(text)} |"


def _section(path: list[str], command: Any) -> list[str]:
    lines = [f"## `floe {' '.join(path)}`", ""]
    help_text = inspect.cleandoc(command.help or "")
    if help_text:
        lines += [help_text, ""]
    parameters = [parameter for parameter in command.params if parameter.name != "help"]
    if parameters:
        lines += ["| argument or option | what it does |", "|---|---|"]
        lines += [_parameter_row(parameter) for parameter in parameters]
        lines.append("")
    if hasattr(command, "list_commands"):  # a group of commands (Typer's own click: duck-typed)
        context = typer.Context(command)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            if sub is not None and not sub.hidden:
                lines += _section([*path, name], sub)
    return lines


def reference() -> str:
    """The text of docs/cli.md."""
    group: Any = typer.main.get_command(app)
    lines = [HEADER]
    context = typer.Context(group)
    global_options = [parameter for parameter in group.params if parameter.name != "help"]
    lines += ["| global option | what it does |", "|---|---|", *map(_parameter_row, global_options), ""]
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is not None and not command.hidden:
            lines += _section([name], command)
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is out of date; write nothing")
    arguments = parser.parse_args()
    text = reference()
    if arguments.check:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(REPO_ROOT)} is out of date: run scripts/cli_reference.py", file=sys.stderr)
            raise SystemExit(1)
        return
    TARGET.parent.mkdir(exist_ok=True)
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
