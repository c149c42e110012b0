"""Every ``contextledger`` command takes ``--dsn``, ``--home`` and ``--tenant`` after its
name, with the same meaning as before it (parsed by click itself; nothing is opened)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from contextledger.cli import main


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            found += _commands(cmd, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


#: Commands that open no ledger: nothing for a target to mean (a new random KEK).
NO_TARGET = {("kek", "generate")}
COMMANDS = [c for c in _commands(main) if c not in NO_TARGET]


def test_the_commands_are_all_found() -> None:
    assert {("anchor",), ("checkpoints",), ("keys", "create"), ("serve",)} <= set(COMMANDS)
    assert len(COMMANDS) >= 19


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_takes_the_target_options(path: tuple[str, ...], tmp_path: Path) -> None:
    root = main.make_context("contextledger", ["--dsn", "memory://"])
    root.obj = {"dsn": "memory://", "home": None, "tenant": None, "log_format": None}
    ctx = root
    cmd: click.Command = main
    for depth, name in enumerate(path):
        assert isinstance(cmd, click.Group)
        sub = cmd.commands[name]
        args: list[str] = list(path[depth + 1 :])  # a group parses its subcommand's name
        if not isinstance(sub, click.Group):
            file = tmp_path / "export.jsonl"
            file.write_text("")
            for param in sub.params:
                if isinstance(param, click.Argument) and param.required:
                    args.append(str(file) if isinstance(param.type, click.File) else "x")
                elif isinstance(param, click.Option) and param.required:
                    args += [param.opts[0], "x"]
                if param.name == "yes":  # purge's confirmation: parsed, not prompted
                    args.append("--yes")
            args += ["--dsn", "postgresql://u@h/db", "--home", str(tmp_path), "--tenant", "t"]
        ctx = sub.make_context(name, args, parent=ctx)
        cmd = sub
    assert root.obj == {
        "dsn": "postgresql://u@h/db",
        "home": str(tmp_path),
        "tenant": "t",
        "log_format": None,
    }
