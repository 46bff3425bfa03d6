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
    cluster.register_model_everywhere("m", geometry, "damp")
    c = cluster.for_conversation("conv-42")          # a statecache.Client
    slots = c.allocate_slots("m", 1)
"""
from __future__ import annotations

import socket
import threading
from typing import Dict, List, Sequence

from statecache.client import Client
from statecache.errors import AlreadyExists
from statecache.ring import DEFAULT_VIRTUAL_NODES, HashRing, Key
from statecache.types import Geometry, ModelInfo, Stats


class ShardedClient:
    def __init__(self, endpoints: Sequence[str], *, virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
                 **client_kwargs):
        self._ring = HashRing(endpoints, virtual_nodes)
        self._kwargs = client_kwargs
        self._clients: Dict[str, Client] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_dns(cls, host: str, port: int = 50051, **kwargs) -> "ShardedClient":
        """One endpoint per address `host` resolves to, e.g. the Kubernetes
        headless Service "statecached-headless.statecache.svc.cluster.local"
        (one A record per ready pod). Endpoints are "ip:port" ("[ip]:port"
        for IPv6). Resolve again (a new ShardedClient) when pods change; the
        ring moves only the conversations of added / removed pods.
        socket.gaierror when the name does not resolve."""
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        eps = set()
        for family, _, _, _, addr in infos:
            ip = addr[0]
            eps.add(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
        return cls(sorted(eps), **kwargs)

    @property
    def ring(self) -> HashRing:
        return self._ring

    @property
    def endpoints(self):
        return self._ring.endpoints

    def endpoint_for(self, conversation_id: Key) -> str:
        return self._ring.route(conversation_id)

    def client(self, endpoint: str) -> Client:
        """The (cached) Client of one endpoint."""
        with self._lock:
            c = self._clients.get(endpoint)
            if c is None:
                if endpoint not in self._ring.endpoints:
                    raise ValueError(f"endpoint: {endpoint!r} not in the ring")
                c = self._clients[endpoint] = Client(endpoint, **self._kwargs)
            return c

    def for_conversation(self, conversation_id: Key) -> Client:
        """The Client of the server that owns `conversation_id`."""
        return self.client(self.endpoint_for(conversation_id))

    def clients(self) -> List[Client]:
        return [self.client(e) for e in self._ring.endpoints]

    def register_model_everywhere(self, model_id: str, geometry: Geometry, format: str = "damp",
                                  *, exist_ok: bool = True, **kw) -> Dict[str, ModelInfo]:
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
        return {e: self.client(e).get_stats() for e in self._ring.endpoints}

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def __enter__(self) -> "ShardedClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
