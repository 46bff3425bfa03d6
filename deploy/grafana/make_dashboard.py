"""Writes statecache_dashboard.json (Grafana 9+ dashboard of statecached).

    python3 deploy/grafana/make_dashboard.py > deploy/grafana/statecache_dashboard.json

Every metric it queries is exported by server/metrics.cc (checked by
//deploy:deploy_config_test). Variables: datasource, instance, model.
"""
import json

SEL = 'instance=~"$instance"'
MSEL = 'instance=~"$instance", model=~"$model"'

panels = []


def panel(title, targets, unit="short", kind="timeseries", w=12, h=8, stack=False,
          description="", max_=None):
    x = (len(panels) * w) % 24 if w == 12 else 0
    p = {
        "id": len(panels) + 1,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": (len(panels) // (24 // w)) * h, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom",
                               "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": e, "legendFormat": l}
                    for i, (e, l) in enumerate(targets)],
    }
    if stack:
        p["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal"},
                                                  "fillOpacity": 30}
    if max_ is not None:
        p["fieldConfig"]["defaults"]["max"] = max_
        p["fieldConfig"]["defaults"]["min"] = 0
    panels.append(p)


panel("State memory by tier (live slots)",
      [(f'sum by (tier) (statecache_state_bytes{{{MSEL}}})', "{{tier}}")],
      unit="bytes", stack=True,
      description="Bytes of allocated slots: hi_rows (fp16 rows of damp), lo_codes, metadata, padding.")
panel("State memory by format vs FP32",
      [(f'sum by (format) (statecache_state_bytes{{{MSEL}}})', "{{format}} stored"),
       (f'sum by (format) (statecache_state_fp32_equivalent_bytes{{{MSEL}}})', "{{format}} as fp32")],
      unit="bytes",
      description="What the live slots take in their format, and what they would take in FP32.")
panel("Compression saving vs FP32",
      [(f'1 - sum by (model, format) (statecache_state_bytes{{{MSEL}}}) / '
        f'(sum by (model, format) (statecache_state_fp32_equivalent_bytes{{{MSEL}}}) > 0)',
        "{{model}} {{format}}")],
      unit="percentunit", max_=1)
panel("Checkpoint memory by tier",
      [(f'sum by (tier) (statecache_checkpoint_bytes{{{MSEL}}})', "{{tier}}"),
       (f'sum(statecache_checkpoint_capacity_bytes{{{MSEL}}})', "capacity"),
       (f'sum(statecache_checkpoint_aux_bytes{{{MSEL}}})', "aux (host)")],
      unit="bytes")
panel("Slots used / capacity",
      [(f'sum by (instance, model) (statecache_slots_used{{{MSEL}}})', "{{instance}} {{model}} used"),
       (f'sum by (instance, model) (statecache_slots_capacity{{{MSEL}}})', "{{instance}} {{model}} capacity")])
panel("Slot pool utilization",
      [(f'statecache_slots_used{{{MSEL}}} / (statecache_slots_capacity{{{MSEL}}} > 0)',
        "{{instance}} {{model}}")],
      unit="percentunit", max_=1,
      description="Alert StatecacheSlotPoolNearlyFull fires above 90% for 5 minutes.")
panel("Checkpoints held / capacity / leased",
      [(f'sum by (model) (statecache_checkpoints{{{MSEL}}})', "{{model}} held"),
       (f'sum by (model) (statecache_checkpoint_capacity{{{MSEL}}})', "{{model}} capacity"),
       (f'sum by (model) (statecache_checkpoints_leased{{{MSEL}}})', "{{model}} leased"),
       (f'sum by (model) (statecache_leases_active{{{MSEL}}})', "{{model}} active leases")])
panel("Checkpoint hit rate",
      [(f'sum by (model) (rate(statecache_prefix_lookups_total{{{MSEL}, result="hit"}}[$__rate_interval])) / '
        f'(sum by (model) (rate(statecache_prefix_lookups_total{{{MSEL}}}[$__rate_interval])) > 0)',
        "{{model}} requests"),
       (f'sum by (model) (rate(statecache_prefix_lookup_tokens_total{{{MSEL}, result="hit"}}[$__rate_interval])) / '
        f'(sum by (model) (rate(statecache_prefix_lookup_tokens_total{{{MSEL}}}[$__rate_interval])) > 0)',
        "{{model}} tokens")],
      unit="percentunit", max_=1,
      description="LookupPrefix hits / lookups, and prompt tokens covered by a checkpoint / candidate tokens.")
panel("Evictions and expired leases",
      [(f'sum by (model) (rate(statecache_checkpoint_evictions_total{{{MSEL}}}[$__rate_interval]))', "{{model}} evictions/s"),
       (f'sum by (model) (rate(statecache_leases_expired_total{{{MSEL}}}[$__rate_interval]))', "{{model}} leases expired/s")],
      unit="ops")
panel("Checkpoint tiers: bytes held",
      [(f'sum by (model, store_tier) (statecache_checkpoint_tier_bytes{{{MSEL}}})', "{{model}} {{store_tier}}"),
       (f'sum by (model, store_tier) (statecache_checkpoint_tier_capacity_bytes{{{MSEL}}})',
        "{{model}} {{store_tier}} capacity")],
      unit="bytes",
      description="Device checkpoint memory, host tier (--host_checkpoint_bytes), disk tier (--disk_checkpoint_dir).")
panel("Checkpoint tiers: hits, demotions, promotions",
      [(f'sum by (store_tier) (rate(statecache_checkpoint_tier_hits_total{{{MSEL}}}[$__rate_interval]))', "{{store_tier}} hits/s"),
       (f'sum by (store_tier) (rate(statecache_checkpoint_tier_demotions_total{{{MSEL}}}[$__rate_interval]))', "{{store_tier}} demotions/s"),
       (f'sum by (store_tier) (rate(statecache_checkpoint_tier_promotions_total{{{MSEL}}}[$__rate_interval]))', "{{store_tier}} promotions/s"),
       (f'sum by (store_tier) (rate(statecache_checkpoint_tier_corrupt_total{{{MSEL}}}[$__rate_interval]))', "{{store_tier}} corrupt/s")],
      unit="ops",
      description="Lookups served per tier; checkpoints moved down a tier on eviction and back to device on a hit.")
panel("Remote (Redis) tier: calls, errors, mean latency",
      [(f'sum by (instance) (rate(statecache_checkpoint_tier_requests_total{{{MSEL}, store_tier="remote"}}[$__rate_interval]))', "{{instance}} calls/s"),
       (f'sum by (instance) (rate(statecache_checkpoint_tier_errors_total{{{MSEL}, store_tier="remote"}}[$__rate_interval]))', "{{instance}} errors/s"),
       (f'sum by (instance) (rate(statecache_checkpoint_tier_request_seconds_total{{{MSEL}, store_tier="remote"}}[$__rate_interval])) * 1000 / '
        f'(sum by (instance) (rate(statecache_checkpoint_tier_requests_total{{{MSEL}, store_tier="remote"}}[$__rate_interval])) > 0)',
        "{{instance}} mean ms/call"),
       (f'sum by (instance) (rate(statecache_checkpoint_tier_write_through_dropped_total{{{MSEL}, store_tier="remote"}}[$__rate_interval]))', "{{instance}} write-through drops/s")],
      unit="short",
      description="Calls to Redis (--redis_checkpoint_address / --redis_cluster_nodes), failed ones "
                  "(each a miss, never a failed RPC), mean wall time per call in milliseconds, and "
                  "snapshot copies not written through (--redis_write_queue_bytes full).")
panel("Snapshot / restore traffic",
      [(f'sum by (model) (rate(statecache_snapshot_bytes_total{{{MSEL}}}[$__rate_interval]))', "{{model}} snapshot B/s"),
       (f'sum by (model) (rate(statecache_restore_bytes_total{{{MSEL}}}[$__rate_interval]))', "{{model}} restore B/s"),
       (f'sum by (model) (rate(statecache_snapshots_total{{{MSEL}}}[$__rate_interval]))', "{{model}} snapshots/s"),
       (f'sum by (model) (rate(statecache_restores_total{{{MSEL}}}[$__rate_interval]))', "{{model}} restores/s")],
      unit="Bps")
for q in ("0.5", "0.99"):
    panel(f"RPC latency p{int(float(q) * 100)} by method",
          [(f'histogram_quantile({q}, sum by (method, le) '
            f'(rate(statecache_rpc_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))', "{{method}}")],
          unit="s")
panel("Update latency percentiles",
      [(f'histogram_quantile({q}, sum by (le) (rate(statecache_rpc_duration_seconds_bucket'
        f'{{{SEL}, method=~"Update|UpdateStream"}}[$__rate_interval])))', f"p{p}")
       for q, p in (("0.5", 50), ("0.9", 90), ("0.99", 99))],
      unit="s")
panel("Kernel time p50 / p99 by op",
      [(f'histogram_quantile({q}, sum by (op, le) '
        f'(rate(statecache_kernel_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))', f"{{{{op}}}} p{p}")
       for q, p in (("0.5", 50), ("0.99", 99))],
      unit="s")
panel("RPCs by method and code",
      [(f'sum by (method, code) (rate(statecache_rpcs_total{{{SEL}}}[$__rate_interval]))',
        "{{method}} {{code}}")],
      unit="reqps")
panel("Update batch size (mean, p90)",
      [(f'sum(rate(statecache_update_batch_size_sum{{{SEL}}}[$__rate_interval])) / '
        f'sum(rate(statecache_update_batch_size_count{{{SEL}}}[$__rate_interval]))', "mean"),
       (f'histogram_quantile(0.9, sum by (le) (rate(statecache_update_batch_size_bucket{{{SEL}}}[$__rate_interval])))',
        "p90")])

dashboard = {
    "uid": "statecache-overview",
    "title": "statecache",
    "description": "statecached: state memory by tier and format, slots, checkpoints, hit rate, latency.",
    "tags": ["statecache"],
    "timezone": "browser",
    "schemaVersion": 37,
    "version": 1,
    "editable": True,
    "refresh": "30s",
    "time": {"from": "now-3h", "to": "now"},
    "templating": {"list": [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
        {"name": "instance", "type": "query", "label": "Server",
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": {"query": "label_values(statecache_slots_capacity, instance)", "refId": "I"},
         "definition": "label_values(statecache_slots_capacity, instance)",
         "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
         "current": {"text": "All", "value": "$__all"}},
        {"name": "model", "type": "query", "label": "Model",
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": {"query": "label_values(statecache_slots_capacity{instance=~\"$instance\"}, model)",
                   "refId": "M"},
         "definition": "label_values(statecache_slots_capacity{instance=~\"$instance\"}, model)",
         "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
         "current": {"text": "All", "value": "$__all"}},
    ]},
    "annotations": {"list": []},
    "panels": panels,
}

print(json.dumps(dashboard, indent=2, ensure_ascii=False))
