"""Leader election, as client-go's ``leaderelection`` does it: only the holder of a ``coordination.k8s.io`` Lease acts.

A Lease is held for ``LEASE_SECONDS`` and renewed every ``RENEW_SECONDS``; a leader that could not renew for
``RENEW_DEADLINE_SECONDS`` stops acting before anyone else may take the Lease (``RENEW_DEADLINE_SECONDS`` <
``LEASE_SECONDS``). Every request goes through ``mmfleet.kube.Kube``, the only module that talks to the API server.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from mmfleet.kube import Kube, Obj, error_text

log = logging.getLogger("mmfleet")
# client-go's timings (leaderelection's LeaseDuration, RetryPeriod, RenewDeadline).
LEASE_SECONDS = 15
RENEW_SECONDS = 2.0
RENEW_DEADLINE_SECONDS = 10.0
# How often the deadline is looked at, apart from the renewals (a renewal may hang for a request's timeout).
DEADLINE_CHECK_SECONDS = 0.5
POD_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _micro_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Observed:
    """A Lease's record as this candidate last read it, and when it last changed by this process's monotonic clock
    (client-go's ``observedRecord`` and ``observedTime``).

    Expiry is judged from when the record was last seen to change, never from the holder's ``renewTime``: that is
    another machine's wall clock, and a skew between the two would let a standby take a live Lease early (its clock
    ahead) or wait for ever (behind). A standby that first sees a Lease therefore waits a full lease duration.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.record: Obj | None = None
        self.changed = -float("inf")

    def holder(self, record: Obj, identity: str) -> str | None:
        """Who else holds the Lease whose spec was just read as ``record``; None: free, expired or ``identity``'s."""
        now = self.clock()
        if record != self.record:
            self.record, self.changed = record, now
        holder = str(record.get("holderIdentity") or "")
        if not holder or holder == identity:
            return None
        duration = float(record.get("leaseDurationSeconds") or LEASE_SECONDS)
        return holder if now < self.changed + duration else None


def own_namespace() -> str | None:
    """The operator pod's namespace; None out of a cluster."""
    with contextlib.suppress(OSError), open(POD_NAMESPACE_FILE, encoding="utf-8") as found:
        return found.read().strip() or None
    return None


def lease_namespace(configured: str) -> str:
    """``configured``, else the pod's own namespace, else ``default`` (out of a cluster)."""
    return configured or own_namespace() or "default"


class Elector:
    """Hold a Lease for as long as the process acts: ``wait`` until it is ours, then ``keep`` it renewed.

    Losing it (another holder, or no renewal for ``RENEW_DEADLINE_SECONDS``) calls ``lost``, which must stop
    every action at once: the default ends the process (as client-go's users do), and its restart waits again.
    """

    def __init__(self, kube: Kube, namespace: str, name: str, lost: Callable[[str], None] | None = None) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.lost = lost or _exit
        self.observed = Observed()
        self.renewed = -float("inf")  # time.monotonic() of the last renewal
        self._stop = threading.Event()
        self._losing = threading.Lock()

    def try_hold(self) -> str | None:
        """One attempt to take or renew the Lease; None when it is ours now, else who holds it."""
        now = datetime.now(UTC)
        spec: Obj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": _micro_time(now),
        }
        lease = self.kube.get_lease(self.namespace, self.name)
        if lease is None:
            body = {"metadata": {"name": self.name}, "spec": {**spec, "acquireTime": _micro_time(now)}}
            created = self.kube.create_lease(self.namespace, body)
            return None if created else "another candidate (created at the same moment)"
        current: Obj = lease.get("spec") or {}
        holder = self.observed.holder(current, self.identity)
        if holder is not None:
            return holder
        if current.get("holderIdentity") != self.identity:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        body = {"metadata": {"name": self.name, "resourceVersion": lease["metadata"]["resourceVersion"]}, "spec": spec}
        replaced = self.kube.replace_lease(self.namespace, body)  # fails (False) if another candidate wrote first
        return None if replaced else "another candidate (updated at the same moment)"

    def wait(self) -> None:
        """Block until the Lease is ours; say who holds it meanwhile (once per holder)."""
        said = None
        while True:
            try:
                holder = self.try_hold()
            except Exception as error:
                holder = f"unknown ({error_text(error)})"
            if holder is None:
                self.renewed = time.monotonic()
                log.info("leader election: holding Lease %s/%s as %s", self.namespace, self.name, self.identity)
                return
            if holder != said:
                log.info("leader election: Lease %s/%s is held by %s; waiting", self.namespace, self.name, holder)
                said = holder
            time.sleep(RENEW_SECONDS)

    def keep(self) -> threading.Thread:
        """Renew the Lease every ``RENEW_SECONDS`` in a daemon thread, and watch the deadline in another: ``lost``
        when no renewal went through for ``RENEW_DEADLINE_SECONDS``, even while a renewal call still hangs (its own
        timeout is the request's, 30 s, longer than the Lease)."""
        threading.Thread(target=self._watch_deadline, name="mmfleet leader deadline", daemon=True).start()
        thread = threading.Thread(target=self._renew_forever, name="mmfleet leader election", daemon=True)
        thread.start()
        return thread

    def _renew_forever(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                holder = self.try_hold()
            except Exception as error:
                log.warning("leader election: renewing Lease %s/%s failed: %s", self.namespace, self.name,
                            error_text(error))  # fmt: skip
                continue
            if holder is None:
                self.renewed = time.monotonic()
            else:
                self._lose(f"Lease {self.namespace}/{self.name} lost ({holder})")
                return

    def _watch_deadline(self) -> None:
        while not self._stop.wait(DEADLINE_CHECK_SECONDS):
            late = time.monotonic() - self.renewed
            if late >= RENEW_DEADLINE_SECONDS:
                self._lose(f"Lease {self.namespace}/{self.name} not renewed for {late:.1f} s")
                return

    def _lose(self, why: str) -> None:
        """``lost`` once, whichever thread found out first; nothing renews after it."""
        with self._losing:
            if self._stop.is_set():
                return
            self._stop.set()
        self.lost(why)

    def release(self) -> None:
        """Stop renewing and free the Lease at once, so a successor need not wait for it to expire."""
        self._stop.set()
        with contextlib.suppress(Exception):
            lease = self.kube.get_lease(self.namespace, self.name)
            if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                body = {
                    "metadata": {"name": self.name, "resourceVersion": lease["metadata"]["resourceVersion"]},
                    "spec": {"leaseDurationSeconds": 1, "renewTime": _micro_time(datetime.now(UTC))},
                }
                self.kube.replace_lease(self.namespace, body)


def _exit(why: str) -> None:
    """Stop acting at once: no handler or autoscaling cycle may run past the loss of the Lease."""
    log.error("leader election: %s; exiting so that only the new holder acts", why)
    logging.shutdown()
    os._exit(3)
