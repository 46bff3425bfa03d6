"""Probes whether the installed grpcio routes by a request-hash key with ring_hash.

Needs two running statecached servers (ports P1 P2); registers model "b" on
the second and sends ListModels with metadata x-conversation=conv-i over one
channel "ipv4:127.0.0.1:P1,127.0.0.1:P2" under several service configs, then
reports whether each key always reached the same server.

    PYTHONPATH=client/python python3 client/python/tools/probe_ring_hash.py P1 P2
    GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY=true ... (the same)

Result with grpcio 1.85 (README "Sharding"): ring_hash_experimental with
requestHashHeader routes consistently ONLY with that environment variable;
without it every call fails INTERNAL "hash attribute not present".
"""
import json, sys, collections, grpc, statecache as sc
p1, p2 = sys.argv[1], sys.argv[2]
c2 = sc.Client(f"127.0.0.1:{p2}")
try: c2.register_model('b', sc.Geometry('gdn',1,1,1,128,128), 'fp32', slots=1, checkpoints=1)
except sc.AlreadyExists: pass
for name, cfg in [("ring_hash_experimental", {"requestHashHeader": "x-conversation"}),
                  ("ring_hash_experimental", {}), ("ring_hash", {"requestHashHeader": "x-conversation"})]:
    sconf = json.dumps({"loadBalancingConfig": [{name: cfg}]})
    ch = grpc.insecure_channel(f"ipv4:127.0.0.1:{p1},127.0.0.1:{p2}",
                               options=[("grpc.service_config", sconf)])
    c = sc.Client("x", channel=ch)
    stub = c._stub
    res = collections.defaultdict(set)
    try:
        for i in range(20):
            for rep in range(3):
                r = stub.ListModels(sc.client.pb2().ListModelsRequest(), timeout=5,
                                    metadata=[("x-conversation", f"conv-{i}")])
                res[i].add(tuple(m.model_id for m in r.models))
        consistent = all(len(v) == 1 for v in res.values())
        servers = collections.Counter(next(iter(v)) for v in res.values() if len(v) == 1)
        print(name, cfg, "consistent per key:", consistent, "spread:", dict(servers))
    except grpc.RpcError as e:
        print(name, cfg, "error:", e.code(), e.details()[:200])
