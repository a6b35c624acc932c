"""A vLLM-compatible mock inference engine, controllable over HTTP, for tests, benchmarks and demos.

``MockEngine`` is the RSGI application, ``Behaviour`` the test-controlled knobs and ``serve`` runs the
application with granian's embedded server. ``gateway mock-engine`` (see ``commands``) starts it.
"""

from gateway.mockengine.behaviour import Behaviour
from gateway.mockengine.server import MockEngine, serve

__all__ = ["Behaviour", "MockEngine", "serve"]
