"""The kopf handlers, one module per concern, registered explicitly by ``register``.

``triggers``: when a fleet is reconciled (the work queue, its workers and every trigger). ``reconcile``: the one
reconcile. ``children``: kopf's indexes and how a child's change is judged. ``discovery``: the cloud, the CRDs and
collector Services, cached. ``autoscale``: the autoscaling loop and its liveness probe. ``connection``: kopf's login,
its requests (not its watches) bounded, a kind no longer served waited out. ``settings``: kopf's settings and cleanup.
``records``: what they keep.
"""

from __future__ import annotations

import kopf

from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet.handlers import autoscale, children, connection, settings, triggers
from mmfleet.handlers.children import CHILD_KINDS, child_labels
from mmfleet.handlers.records import MEMO_KEY, Operator


def register(registry: kopf.OperatorRegistry) -> None:
    """Every handler of the operator, in ``registry``; nothing registers itself on import."""
    settings.quiet_optional_kinds()
    on = kopf.on
    on.login(registry=registry)(connection.login)
    on.startup(registry=registry)(settings.configure_operator)
    on.startup(registry=registry)(triggers.start_workers)
    on.startup(registry=registry)(autoscale.start_autoscaler)
    on.cleanup(registry=registry)(triggers.stop_workers)
    on.cleanup(registry=registry)(autoscale.stop_autoscaler)
    on.cleanup(registry=registry)(settings.report_requests)
    on.probe(id="autoscaler", registry=registry)(autoscale.check_autoscaler)
    kopf.index(GROUP, VERSION, PLURAL, id="fleets", registry=registry)(children.fleets)
    kopf.index(
        "apps", "v1", "deployments", labels=child_labels("deployments"), id="fleet_deployments", registry=registry
    )(children.fleet_deployments)
    kopf.index("", "v1", "pods", labels=child_labels("pods"), id="fleet_pods", registry=registry)(children.fleet_pods)
    on.event(GROUP, VERSION, PLURAL, id="fleet_events", registry=registry)(triggers.on_fleet_event)
    for group, version, plural in CHILD_KINDS:
        on.event(group, version, plural, labels=child_labels(plural), id=f"watch_{plural}", registry=registry)(
            triggers.on_child_event
        )


def memo(op: Operator) -> kopf.Memo:
    """kopf's memo carrying ``op`` to every handler."""
    return kopf.Memo({MEMO_KEY: op})


__all__ = ["Operator", "memo", "register"]
