"""The Grafana dashboard of mmfleet's fleets, generated so its PromQL has one source.

The pods' signals use the autoscaler's own queries (``autoscaler.metrics``, the backends' metric
names from ``mmfleet.backends``), over every backend at once, narrowed by the dashboard's
``namespace`` and ``fleet`` variables; what only the operator knows (replicas it set and counted,
the SLO target and the percentile it read, attainment, scale events, the cold start it plans with,
its own work) comes from its ``/metrics`` (``metrics_export``). ``make crds`` writes
``charts/mmfleet/files/dashboards/mmfleet.json``; a test fails when the file and this module differ.
"""

from __future__ import annotations

import json
import sys
from typing import Any, get_args

from mmfleet import routing
from mmfleet.api import BackendName
from mmfleet.autoscaler.metrics import (
    RATE_WINDOW,
    EncodeLatency,
    Slo,
    encode_latency_query,
    latency_query,
    signal_query,
)
from mmfleet.backends import vllm
from mmfleet.metrics_export import (
    ATTAINMENT,
    COLD_START,
    COLD_START_PHASES,
    CYCLE_SECONDS,
    DECISIONS,
    DESIRED,
    ERRORS,
    MAX_REPLICAS,
    METRICS_AVAILABLE,
    QUERY_SECONDS,
    READY,
    RECONCILES,
    SCALE_EVENTS,
    SLO_OBSERVED,
    SLO_TARGET,
    STARTING,
    UNSCHEDULABLE,
)

UID = "mmfleet-fleets"
BACKENDS: tuple[str, ...] = get_args(BackendName)
FLEET = 'namespace=~"$namespace", mmfleet_io_inference=~"$fleet"'
LEGEND = "{{namespace}}/{{mmfleet_io_inference}}"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24
HEIGHT = 8
SUMMARY_WINDOW = "5m"  # the operator's counters: events and rates over this window


def name(metric: Any, suffix: str = "") -> str:
    """The exposed name of a prometheus_client metric (counters without ``_total``, so ``suffix`` adds it)."""
    family: str = metric.describe()[0].name
    return family + suffix


def fleet_series(metric: Any, suffix: str = "") -> str:
    return f"{name(metric, suffix)}{{{FLEET}}}"


def picker(metric: str, suffix: str = "") -> str:
    """A series of the fleets' endpoint pickers, which their PodMonitor labels as the servers' are."""
    return f"{metric}{suffix}{{{FLEET}}}"


def per_fleet_rate(series: str, window: str, *by: str) -> str:
    labels = ", ".join(("namespace", "mmfleet_io_inference", *by))
    return f"sum by ({labels}) (rate({picker(series)}[{window}]))"


def quantile(q: float, histogram: str, window: str, *by: str) -> str:
    """The ``q`` quantile per fleet (and ``by``) of a picker histogram over ``window``."""
    return f"histogram_quantile({q:g}, {per_fleet_rate(histogram + '_bucket', window, *by, 'le')})"


def target(expr: str, legend: str = LEGEND) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend}


def panel(title: str, description: str, targets: list[dict[str, Any]], unit: str = "short") -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]}},
        "targets": [{**t, "refId": chr(ord("A") + i)} for i, t in enumerate(targets)],
    }


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def panels() -> list[dict[str, Any]]:
    """The dashboard's rows and panels, in order."""
    latency = [
        target(latency_query(Slo("e2e", p, RATE_WINDOW), BACKENDS, FLEET), f"P{p:g} {LEGEND}") for p in (50, 90, 99)
    ]
    window = SUMMARY_WINDOW
    return [
        row("Replicas"),
        panel(
            "Replicas",
            "What the autoscaler set (desired) and the fleet's pods as it counted them: Ready, starting, "
            "unschedulable (no node with free GPUs); maxReplicas for scale.",
            [
                target(fleet_series(DESIRED), f"desired {LEGEND}"),
                target(fleet_series(READY), f"ready {LEGEND}"),
                target(fleet_series(STARTING), f"starting {LEGEND}"),
                target(fleet_series(UNSCHEDULABLE), f"unschedulable {LEGEND}"),
                target(fleet_series(MAX_REPLICAS), f"max {LEGEND}"),
            ],
        ),
        row("SLO"),
        panel(
            "SLO percentile against its target",
            "The percentile of the fleet's SLO metric over its window, as the autoscaler read it, and the target.",
            [
                target(fleet_series(SLO_OBSERVED), f"observed {LEGEND}"),
                target(fleet_series(SLO_TARGET), f"target {LEGEND}"),
            ],
            unit="s",
        ),
        panel(
            "SLO attainment (last hour)",
            "Share of the last hour's autoscaling cycles whose measured percentile met the target "
            "(status.slo.attainment).",
            [target(fleet_series(ATTAINMENT))],
            unit="percentunit",
        ),
        panel(
            "Metrics available",
            "1 when the autoscaler read every signal of the fleet this cycle; 0: it holds (MetricsAvailable).",
            [target(fleet_series(METRICS_AVAILABLE))],
        ),
        row("Traffic"),
        panel(
            "Request rate",
            f"Completed requests per second, summed over the fleet's pods (rate over {RATE_WINDOW}).",
            [target(signal_query("request_rate", BACKENDS, RATE_WINDOW, FLEET))],
            unit="reqps",
        ),
        panel(
            "Queue",
            "Requests waiting and running, summed over the fleet's pods.",
            [
                target(signal_query("waiting", BACKENDS, RATE_WINDOW, FLEET), f"waiting {LEGEND}"),
                target(signal_query("running", BACKENDS, RATE_WINDOW, FLEET), f"running {LEGEND}"),
            ],
        ),
        panel(
            "KV-cache use",
            "The share of each pod's KV cache in use, averaged over the fleet's pods.",
            [target(signal_query("kv_cache_usage", BACKENDS, RATE_WINDOW, FLEET))],
            unit="percentunit",
        ),
        panel(
            "End-to-end latency from the pods",
            f"P50, P90 and P99 of the request latency histogram over {RATE_WINDOW}, summed over the fleet's pods: with "
            "an encode tier, the sidecar's, from the request's arrival at the pod, where it covers most requests (the "
            "autoscaler's own query).",
            latency,
            unit="s",
        ),
        row("Scaling"),
        panel(
            "Scale events",
            f"Replica changes the autoscaler made, up and down, over {window}.",
            [target(f"increase({fleet_series(SCALE_EVENTS, '_total')}[{window}])", f"{{{{direction}}}} {LEGEND}")],
        ),
        panel(
            "Decisions by cause",
            f"What the autoscaler's cycles did with the fleet over {window} (scaled, or what held it).",
            [
                target(
                    f"sum by (namespace, mmfleet_io_inference, decision) "
                    f"(increase({fleet_series(DECISIONS, '_total')}[{window}]))",
                    f"{{{{decision}}}} {LEGEND}",
                )
            ],
        ),
        panel(
            "Cold start",
            "The cold start the autoscaler plans with: the median creation-to-Ready of the fleet's pods, "
            "or the default.",
            [target(fleet_series(COLD_START))],
            unit="s",
        ),
        panel(
            "Cold start by phase",
            "The new replicas' cold start, the median since the operator started (replicas start rarely): the "
            "whole, and each phase Kubernetes timestamps (scheduled: waiting for a node; initialized: sandbox, "
            "volumes, init containers; started: images pulled; ready: weights loaded, compiled, probe passed).",
            [
                target(
                    "histogram_quantile(0.5, sum by (namespace, mmfleet_io_inference, phase, le) "
                    f"({fleet_series(COLD_START_PHASES, '_bucket')}))",
                    f"{{{{phase}}}} {LEGEND}",
                )
            ],
            unit="s",
        ),
        row("Routing"),
        panel(
            "Picker: pool saturation and held requests",
            "Routing mode inferencePool: how saturated the endpoint picker finds the fleet (0 idle, 1 saturated: "
            "the utilization detector's thresholds, from the SLO) and the requests its flow control holds.",
            [
                target(
                    f"max by (namespace, mmfleet_io_inference) ({picker(routing.SATURATION_METRIC)})",
                    f"saturation {LEGEND}",
                ),
                target(f"sum by (namespace, mmfleet_io_inference) ({picker(routing.HELD_METRIC)})", f"held {LEGEND}"),
            ],
        ),
        panel(
            "Picker: time held (P90)",
            f"P90 of the time requests spent in the picker's flow control, by outcome (dispatched, or evicted at its "
            f"TTL), over {window}.",
            [target(quantile(0.9, routing.HELD_SECONDS_METRIC, window, "outcome"), f"{{{{outcome}}}} {LEGEND}")],
            unit="s",
        ),
        panel(
            "Picker: prefix-index hit ratio",
            f"Mean share of a request's prefix the picker found on the replica it chose (its approximate index of "
            f"the servers' prefix caches: repeated images and conversation turns), over {window}.",
            [
                target(
                    f"{per_fleet_rate(routing.PREFIX_HIT_METRIC + '_sum', window)} / "
                    f"{per_fleet_rate(routing.PREFIX_HIT_METRIC + '_count', window)}"
                )
            ],
            unit="percentunit",
        ),
        panel(
            "Picker: scheduling time (P90)",
            f"P90 of the picker's time to choose a replica for a request, over {window}.",
            [target(quantile(0.9, routing.SCHEDULING_SECONDS_METRIC, window))],
            unit="s",
        ),
        row("Encode tier"),
        panel(
            "Encode tier: the wait for it (P90)",
            "With spec.disaggregation.encode: P90 of what requests with images waited at the serving pods' sidecars "
            "for the encode tier (its share of their TTFT; with its autoscaling, held to its share of the SLO).",
            [target(encode_latency_query(EncodeLatency(90, RATE_WINDOW), FLEET))],
            unit="s",
        ),
        panel(
            "Encode tier: items sent and failed calls",
            "Images, videos and audio clips per second the sidecars sent to the encode tier (its demand), and calls "
            "per second that brought no encoder outputs (the servers encoded those items themselves).",
            [
                target(per_fleet_rate(vllm.ENCODE_ITEMS, RATE_WINDOW), f"items/s {LEGEND}"),
                target(per_fleet_rate(vllm.ENCODE_FAILURES, RATE_WINDOW), f"failed calls/s {LEGEND}"),
            ],
        ),
        row("Operator"),
        panel(
            "Reconciles and errors",
            f"Reconciles per second by result, and unexpected errors by place, over {window}.",
            [
                target(f"sum by (result) (rate({name(RECONCILES, '_total')}[{window}]))", "reconcile {{result}}"),
                target(f"sum by (where) (rate({name(ERRORS, '_total')}[{window}]))", "error {{where}}"),
            ],
            unit="ops",
        ),
        panel(
            "Autoscaler cycle and Prometheus query time (P90)",
            f"How long one autoscaling cycle for all fleets took, and one query to Prometheus, over {window}.",
            [
                target(
                    f"histogram_quantile(0.9, sum by (le) (rate({name(CYCLE_SECONDS, '_bucket')}[{window}])))", "cycle"
                ),
                target(
                    f"histogram_quantile(0.9, sum by (le, result) (rate({name(QUERY_SECONDS, '_bucket')}[{window}])))",
                    "query {{result}}",
                ),
            ],
            unit="s",
        ),
    ]


def _laid_out(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows full width; panels two to a line under them; ids in order."""
    out, x, y = [], 0, 0
    for index, item in enumerate(items, start=1):
        if item["type"] == "row":
            y += HEIGHT if x else 0
            x = 0
            out.append({**item, "id": index, "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y}})
            y += 1
            continue
        out.append({**item, "id": index, "gridPos": {"h": HEIGHT, "w": WIDTH // 2, "x": x, "y": y}})
        x = (x + WIDTH // 2) % WIDTH
        y += HEIGHT if x == 0 else 0
    return out


def variable(label: str, var: str, query: str) -> dict[str, Any]:
    return {
        "name": var,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{var}-variable"},
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    fleets = name(DESIRED)
    return {
        "uid": UID,
        "title": "mmfleet: fleets",
        "description": "Per fleet: replicas, the SLO, traffic, scaling; and the mmfleet operator's own work.",
        "tags": ["mmfleet"],
        "editable": True,
        "schemaVersion": 39,
        "time": {"from": "now-3h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                variable("Namespace", "namespace", f"label_values({fleets}, namespace)"),
                variable("Fleet", "fleet", f'label_values({fleets}{{namespace=~"$namespace"}}, mmfleet_io_inference)'),
            ]
        },
        "panels": _laid_out(panels()),
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def expressions(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of a dashboard, in order."""
    return [(p["title"], t["expr"]) for p in document["panels"] if p["type"] != "row" for t in p["targets"]]


if __name__ == "__main__":
    sys.stdout.write(dashboard_json())
