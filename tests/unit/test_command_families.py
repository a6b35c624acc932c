"""The command line imports only the family of the command it runs (``gateway.commands.main``): each
family's entry in ``FAMILIES`` names exactly the commands it registers, so that every command is found
whichever way the parser is built, and ``--help`` still lists them all."""

from __future__ import annotations

import argparse

import pytest

from gateway.commands.main import FAMILIES, build_parser, command_of


def commands(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_each_family_registers_the_commands_it_is_listed_with() -> None:
    listed = [c for family in FAMILIES.values() for c in family]
    assert commands(build_parser()) == listed  # in the order --help shows them
    for family in FAMILIES.values():
        for command in family:
            assert commands(build_parser(command)) == list(family)


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["keys", "create", "--principal", "alice"], "keys"),
        (["mock-engine", "--port", "8001"], "mock-engine"),
        (["budgets", "--json"], "budgets"),
        (["--help"], None),
        (["--version"], None),
        ([], None),
        (["no-such-command"], None),
    ],
)
def test_the_command_is_the_first_word_that_is_not_an_option(argv: list[str], command: str | None) -> None:
    assert command_of(argv) == command
