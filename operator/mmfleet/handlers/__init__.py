"""The kopf handlers, one module per concern; importing this package registers them all.

``fleet``: reconcile, drift repair, pruning and status. ``autoscale``: the autoscaling loop and
its liveness probe. ``connection``: kopf's login, its requests (not its watches) bounded. ``state``: what
they share.
"""

from mmfleet.handlers import autoscale, connection, fleet

__all__ = ["autoscale", "connection", "fleet"]
