pytest_plugins = [
    "tests.fixtures.httpx_tls",
    "tests.fixtures.processes",
    "tests.fixtures.postgres",
    "tests.fixtures.streaming_upstream",
]
