pytest_plugins = ["tests.fixtures.processes"]
