"""Finding a problem's place in the TOML source, for one-line errors that name the line."""

from __future__ import annotations

import tomllib

import pytest

from gateway.controlplane.config.parser import parse_config
from gateway.controlplane.config.toml_places import TomlPlaces
from gateway.errors import ConfigError

SOURCE = """\
# a comment = not a key
[[backends]]
name = "a"
url = "http://127.0.0.1:9"

[[backends]]
name = "b"
"quoted key" = 1
wibble.deep = 2

[[models]]
name = "m"
notes = \"\"\"
fake = "inside a string"
\"\"\"
  [[models.rules]]
  when = "x"
  [[models.rules]]
  when = "y"

[[models]]
name = "n"
chain = [{ backend = "a" }]

[principals.alice]
roles = ["user"]
"""


@pytest.mark.parametrize(
    ("place", "line"),
    [
        ("backends[0]", 2),
        ("backends[0].url", 4),
        ("backends[1].name", 7),
        ("backends[1].quoted key", 8),
        ("backends[1].wibble.deep", 9),
        ("backends[1].wibble", 9),
        ("models[0].rules[1].when", 19),
        ("models[0].rules[1]", 18),
        ("models[1].chain[0].backend", 23),  # inside an inline table: the key that holds it
        ("models[0].fake", 11),  # a line inside a multi-line string is not a key
        ("principals", 25),
        ("principals.alice.roles", 26),
        ("backends[7].url", 2),  # no such element: the section's first line
        ("nowhere", None),
    ],
)
def test_line_of_each_place(place: str, line: int | None) -> None:
    assert TomlPlaces(SOURCE).line_of(place) == line


def test_every_problem_of_a_file_is_one_line_with_its_line_number() -> None:
    text = '[[backends]]\nname = "a"\nurl = "ftp://x"\nwibble = 1\n'

    with pytest.raises(ConfigError) as caught:
        parse_config(tomllib.loads(text), "gw.toml", text)
    assert caught.value.message.splitlines() == [
        "gw.toml:4: backends[0].wibble: unknown field (expected one of: api_key, api_key_env,"
        " api_key_file, connect_timeout, credentials, first_byte_timeout, health_path, kv_events,"
        " kv_high_water, max_concurrency, name, protocol, queue_size, queue_timeout, read_timeout,"
        " reserved_places, responses_api, url, waiting_high_water)",
        "gw.toml:3: backends[0].url: must be an http:// or https:// URL",
    ]
