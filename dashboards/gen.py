#!/usr/bin/env python3
"""Writes the Grafana dashboards of `twofold serve` (run it after editing; the JSON is
committed and linted by tests/serve.rs)."""
import json

DS = {"type": "prometheus", "uid": "${datasource}"}
N = 'node=~"$node"'
NF = 'node=~"$node",file_id=~"$file"'
JOIN = ' * on (node, file_id) group_left (path) twofold_file_info{%s}'


def templating(with_file):
    vars_ = [
        {"name": "datasource", "type": "datasource", "query": "prometheus",
         "label": "Data source", "current": {}, "hide": 0},
        {"name": "node", "type": "query", "datasource": DS, "label": "Node",
         "query": {"query": "label_values(twofold_build_info, node)", "refId": "node"},
         "definition": "label_values(twofold_build_info, node)",
         "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "current": {}},
    ]
    if with_file:
        q = 'label_values(twofold_file_info{node=~"$node"}, file_id)'
        vars_.append({"name": "file", "type": "query", "datasource": DS, "label": "File (file_id)",
                      "query": {"query": q, "refId": "file"}, "definition": q,
                      "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
                      "current": {}})
    return {"list": vars_}


def panel(i, title, expr, unit, kind="timeseries", legend="", w=12, desc=""):
    return {
        "id": i, "type": kind, "title": title, "description": desc, "datasource": DS,
        "gridPos": {"h": 8, "w": w, "x": (0 if i % 2 else 12) if w == 12 else 0, "y": (i - 1) // 2 * 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "targets": [{"refId": "A", "datasource": DS, "expr": expr, "legendFormat": legend,
                     **({"format": "table", "instant": True} if kind == "table" else {})}],
    }


def dashboard(uid, title, panels, with_file=False):
    return {
        "uid": uid, "title": title, "tags": ["twofold"], "schemaVersion": 39, "version": 1,
        "editable": True, "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "templating": templating(with_file), "annotations": {"list": []},
        "panels": [panel(i + 1, *p) for i, p in enumerate(panels)],
    }


fleet = dashboard("twofold-fleet", "twofold / fleet overview", [
    ("Excess model bytes by node", f'sum by (node) (twofold_file_excess_bytes{{{N}}})', "bytes",
     "timeseries", "{{node}}", 12, "Bytes held beyond one copy of each file, summed per node."),
    ("Files in memory more than once", f'count by (node) (twofold_file_copies{{{N}}} > 1)', "none",
     "timeseries", "{{node}}"),
    ("Proven private copies by node",
     f'sum by (node) (twofold_file_held_bytes{{{N},kind="private_copy_proven"}})', "bytes",
     "timeseries", "{{node}}"),
    ("Model bytes in memory by kind", f'sum by (kind) (twofold_file_held_bytes{{{N}}})', "bytes",
     "timeseries", "{{kind}}"),
    ("Top files by excess bytes",
     f'topk(10, twofold_file_excess_bytes{{{N}}}' + JOIN % N + ')', "bytes", "table"),
    ("Exporters", f'sum by (version) (twofold_build_info{{{N}}})', "none", "stat", "{{version}}"),
    ("Collection duration (p90)",
     f'histogram_quantile(0.9, sum by (node, le) (rate(twofold_collect_duration_seconds_bucket{{{N}}}[$__rate_interval])))',
     "s", "timeseries", "{{node}}"),
    ("Last good collection age", f'max by (node) (twofold_collect_last_success_age_seconds{{{N}}})',
     "s", "timeseries", "{{node}}", 12, "The exporter's /healthz fails above 3 intervals."),
    ("Errors by kind", f'sum by (node, kind) (rate(twofold_collect_errors_total{{{N}}}[$__rate_interval]))',
     "ops", "timeseries", "{{node}} {{kind}}"),
    ("Exporter RSS", f'max by (node) (process_resident_memory_bytes{{{N}}} and on (node, instance) twofold_build_info{{{N}}})',
     "bytes", "timeseries", "{{node}}"),
])

node = dashboard("twofold-node", "twofold / node", [
    ("Copies per file", f'twofold_file_copies{{{N}}}' + JOIN % N, "none", "timeseries", "{{path}}"),
    ("Held bytes by kind", f'sum by (kind) (twofold_file_held_bytes{{{N}}})', "bytes", "timeseries",
     "{{kind}}"),
    ("Private bytes by cgroup", f'sum by (cgroup, kind) (twofold_cgroup_file_held_bytes{{{N}}})',
     "bytes", "timeseries", "{{cgroup}} {{kind}}"),
    ("Private bytes by workload", f'sum by (workload, kind) (twofold_workload_file_held_bytes{{{N}}})',
     "bytes", "timeseries", "{{workload}} {{kind}}"),
    ("Cgroup memory usage", f'twofold_cgroup_memory_usage_bytes{{{N}}}', "bytes", "timeseries",
     "{{cgroup}}"),
    ("Cgroup memory peak", f'twofold_cgroup_memory_peak_bytes{{{N}}}', "bytes", "timeseries",
     "{{cgroup}}"),
    ("Cgroup usage of its limit",
     f'twofold_cgroup_memory_usage_bytes{{{N}}} / twofold_cgroup_memory_limit_bytes{{{N}}}',
     "percentunit", "timeseries", "{{cgroup}}", 12,
     "Only cgroups with a memory limit (needs a limited cgroup)."),
    ("OOM kills", f'sum by (cgroup) (increase(twofold_cgroup_oom_kills_total{{{N}}}[$__rate_interval]))',
     "none", "timeseries", "{{cgroup}}"),
    ("Series folded into other", f'sum by (node) (rate(twofold_series_dropped_total{{{N}}}[$__rate_interval]))',
     "ops", "timeseries", "{{node}}"),
    ("Files whose count is a lower bound", f'sum by (node) (twofold_file_copies_lower_bound{{{N}}})',
     "none", "stat", "{{node}}"),
])

file_ = dashboard("twofold-file", "twofold / file", [
    ("Copies", f'twofold_file_copies{{{NF}}}' + JOIN % NF, "none", "timeseries", "{{path}}"),
    ("Held bytes by kind", f'twofold_file_held_bytes{{{NF}}}', "bytes", "timeseries",
     "{{file_id}} {{kind}}"),
    ("Page-cache resident", f'twofold_file_resident_ratio{{{NF}}}', "percentunit", "timeseries",
     "{{file_id}}"),
    ("Excess bytes", f'twofold_file_excess_bytes{{{NF}}}', "bytes", "timeseries", "{{file_id}}"),
    ("Size", f'twofold_file_size_bytes{{{NF}}}', "bytes", "stat", "{{file_id}}"),
    ("Count is a lower bound", f'twofold_file_copies_lower_bound{{{NF}}}', "bool", "stat",
     "{{file_id}}"),
    ("Holders by workload", f'sum by (workload, kind) (twofold_workload_file_held_bytes{{{NF}}})',
     "bytes", "timeseries", "{{workload}} {{kind}}"),
    ("Paths", f'twofold_file_info{{{NF}}}', "none", "table"),
], with_file=True)

for name, d in [("fleet", fleet), ("node", node), ("file", file_)]:
    with open(f"twofold-{name}.json", "w") as f:
        json.dump(d, f, indent=2)
        f.write("\n")
