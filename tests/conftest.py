pytest_plugins = ["tests.fixtures.processes", "tests.fixtures.postgres", "tests.fixtures.streaming_upstream"]
