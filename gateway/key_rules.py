"""Per-key rules narrower than the key's principal: the client networks a key may be used from and the
model names it may call. Decoded once per snapshot generation; the request path asks ``address_refusal``
and ``model_refusal``, and only for a key that carries rules (one attribute test for every other key).
No I/O here.
"""

from __future__ import annotations

import ipaddress
from typing import Any

__all__ = ["KeyRules"]

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Addresses remembered per key before the memo starts over: a key used from a handful of hosts parses
# each address once, and a key hammered from many addresses cannot grow a worker's memory.
_MEMO = 256


class KeyRules:
    __slots__ = ("_memo", "models", "name", "networks")

    def __init__(self, name: str, networks: tuple[_Network, ...], models: frozenset[str] | None) -> None:
        self.name = name
        self.networks = networks  # empty: any address
        self.models = models  # None: every model its principal may use
        self._memo: dict[str, bool] = {}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> KeyRules | None:
        networks = tuple(ipaddress.ip_network(n) for n in doc.get("allow_ips") or ())
        models = doc.get("models")
        if not networks and models is None:
            return None
        return cls(str(doc.get("name", "")), networks, None if models is None else frozenset(models))

    def allows_address(self, address: str) -> bool:
        if not self.networks:
            return True
        seen = self._memo.get(address)
        if seen is None:
            seen = self._match(address)
            if len(self._memo) >= _MEMO:
                self._memo.clear()
            self._memo[address] = seen
        return seen

    def _match(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:  # no usable address (a Unix socket, an odd peer name): not in any network
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:10.1.2.3 from a dual-stack listener is 10.1.2.3
        return any(ip in net for net in self.networks)

    def address_refusal(self, address: str) -> str | None:
        if self.allows_address(address):
            return None
        return f"This API key may not be used from {address or 'an unknown address'}"

    def model_refusal(self, route_name: str, called: str) -> str | None:
        if self.models is None or route_name in self.models:
            return None
        return f"This API key may not use the model `{called}`"
