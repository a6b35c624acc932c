"""A vLLM-compatible mock inference engine, controllable over HTTP, for tests, benchmarks and demos.

``server.MockEngine`` is the RSGI application, ``behaviour.Behaviour`` the test-controlled knobs and
``server.serve`` runs the application with granian's embedded server; ``anthropic``, ``gemini``,
``responses`` and ``responses_api`` answer each API's shape, ``agent`` plays a coding agent's tool calls.
``gateway mock-engine`` (``gateway.commands.mock_engine``) starts it. Importing this package does no I/O.
"""
