"""The operator's own metrics, as the alerts and the dashboard read them."""

from __future__ import annotations

from mmfleet import metrics_export


def exported_series() -> set[str]:
    """Every series name the operator's registry can expose (a labelled metric has no sample until first used)."""
    suffixes = {"counter": ("_total",), "histogram": ("_count", "_sum", "_bucket"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in metrics_export.REGISTRY.collect()
        for suffix in suffixes.get(family.type, ("",))
    }
