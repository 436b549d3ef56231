"""The kopf handlers, one module per concern; importing this package registers them all.

``fleet``: reconcile, drift repair, pruning and status. ``autoscale``: the autoscaling loop and
its liveness probe. ``state``: what they share.
"""

from mmfleet.handlers import autoscale, fleet

__all__ = ["autoscale", "fleet"]
