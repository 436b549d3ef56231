"""The largest spec fields the CRD accepts: every list at its maxItems, every string at its maxLength, all valid."""

from __future__ import annotations

from typing import Any

# A label key of the most characters Kubernetes accepts: a 253-character DNS-subdomain prefix, '/', a 63-character name.
_PREFIX = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
VALUE = "v" * 63


def label_key(i: int) -> str:
    return f"{_PREFIX}/{'k' * 61}{i:02d}"


def label_map(count: int = 16) -> dict[str, str]:
    return {label_key(i): VALUE for i in range(count)}


def _requirement(i: int) -> dict[str, Any]:
    return {"key": label_key(i), "operator": "In", "values": [VALUE] * 16}


def _selector() -> dict[str, Any]:
    return {"matchLabels": label_map(), "matchExpressions": [_requirement(i) for i in range(4)]}


def _pod_term() -> dict[str, Any]:
    return {
        "labelSelector": _selector(),
        "namespaceSelector": _selector(),
        "namespaces": ["n" * 63] * 16,
        "topologyKey": label_key(0),
    }


def _pod_affinity() -> dict[str, Any]:
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": [_pod_term()] * 4,
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": _pod_term()}] * 4,
    }


def largest_affinity() -> dict[str, Any]:
    """~0.4 MB: every list and string of spec.placement.affinity at its limit."""
    term = {"matchExpressions": [_requirement(i) for i in range(4)]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term] * 4},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": term}] * 4,
        },
        "podAffinity": _pod_affinity(),
        "podAntiAffinity": _pod_affinity(),
    }
