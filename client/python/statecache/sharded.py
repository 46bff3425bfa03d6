"""ShardedClient: several statecached servers, one conversation per server.

A conversation id is routed by the consistent-hash ring (statecache.ring, the
same algorithm and test vectors as the C++ client's //client/routing:ring),
so all of a conversation's slots and checkpoints live on one server, and
adding or removing one of N servers moves only ~1/N of the conversations.

Routing is done in the client, not by gRPC's ring_hash policy: grpcio's
ring_hash needs a request-hash key from xDS or the experimental
request_hash_header (not in the C++ client's Debian gRPC 1.51), and its hash
(xxhash of the header) differs from ours, so Python and C++ workers would
disagree. See README "Sharding".

    cluster = ShardedClient(["10.0.0.1:50051", "10.0.0.2:50051"])
    # or, in Kubernetes: ShardedClient.from_dns("statecached-headless.statecache.svc", 50051)
    cluster.register_model_everywhere("m", geometry, "damp", slots=64, checkpoints=256)
    c = cluster.for_conversation("conv-42")          # a statecache.Client
    slots = c.allocate_slots("m", 1)
"""
from __future__ import annotations

import socket
import threading
from typing import Any, Dict, List, Sequence, Tuple

from statecache.client import Client
from statecache.errors import AlreadyExists, InvalidArgument, Unavailable
from statecache.ring import DEFAULT_VIRTUAL_NODES, HashRing, Key
from statecache.types import Geometry, ModelInfo, Stats


def resolve(host: str, port: int) -> List[str]:
    """Sorted "ip:port" ("[ip]:port" for IPv6) endpoints of every address
    `host` resolves to; Unavailable naming host when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise Unavailable(f"host: {host!r} does not resolve ({e}); off-cluster, pass the "
                          f"endpoints to ShardedClient([...]) instead", "from_dns") from None
    eps = set()
    for family, _, _, _, addr in infos:
        ip = addr[0]
        eps.add(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
    if not eps:
        raise Unavailable(f"host: {host!r} resolves to no address", "from_dns")
    return sorted(eps)


class ShardedClient:
    """Clients of several servers behind a consistent-hash ring of
    conversation ids (see the module docstring); client_kwargs (token=,
    timeout=, TLS, ...) go to every Client."""

    def __init__(self, endpoints: Sequence[str], *, virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
                 **client_kwargs: Any):
        self._ring = HashRing(endpoints, virtual_nodes)
        self._kwargs = client_kwargs
        self._clients: Dict[str, Client] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_dns(cls, host: str, port: int = 50051, **kwargs: Any) -> "ShardedClient":
        """One endpoint per address `host` resolves to, e.g. the Kubernetes
        headless Service "statecached-headless.statecache.svc.cluster.local"
        (one A record per ready pod). Endpoints are "ip:port" ("[ip]:port"
        for IPv6). Resolve again (a new ShardedClient) when pods change; the
        ring moves only the conversations of added / removed pods.
        Unavailable (naming host) when the name does not resolve."""
        return cls(resolve(host, port), **kwargs)

    @property
    def ring(self) -> HashRing:
        """The routing ring."""
        return self._ring

    @property
    def endpoints(self) -> Tuple[str, ...]:
        """Every endpoint of the ring, sorted."""
        return tuple(self._ring.endpoints)

    def endpoint_for(self, conversation_id: Key) -> str:
        """The endpoint that owns `conversation_id`."""
        return self._ring.route(conversation_id)

    def client(self, endpoint: str) -> Client:
        """The (cached) Client of one endpoint."""
        with self._lock:
            c = self._clients.get(endpoint)
            if c is None:
                if endpoint not in self._ring.endpoints:
                    raise InvalidArgument(f"endpoint: {endpoint!r} not in the ring", "client")
                c = self._clients[endpoint] = Client(endpoint, **self._kwargs)
            return c

    def for_conversation(self, conversation_id: Key) -> Client:
        """The Client of the server that owns `conversation_id`."""
        return self.client(self.endpoint_for(conversation_id))

    def clients(self) -> List[Client]:
        """The Client of every endpoint, in ring order."""
        return [self.client(e) for e in self._ring.endpoints]

    def register_model_everywhere(self, model_id: str, geometry: Geometry, format: str = "damp",
                                  *, exist_ok: bool = True, **kw: Any) -> Dict[str, ModelInfo]:
        """Registers the model on every server (an existing registration is
        described instead when exist_ok)."""
        out = {}
        for e in self._ring.endpoints:
            c = self.client(e)
            try:
                out[e] = c.register_model(model_id, geometry, format, **kw)
            except AlreadyExists:
                if not exist_ok:
                    raise
                out[e] = c.describe_model(model_id)
        return out

    def stats(self) -> Dict[str, Stats]:
        """get_stats() of every server, by endpoint."""
        return {e: self.client(e).get_stats() for e in self._ring.endpoints}

    def close(self) -> None:
        """Closes every Client made so far."""
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def __enter__(self) -> "ShardedClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
