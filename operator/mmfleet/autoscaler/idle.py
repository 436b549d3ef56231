"""Scale to zero (pure): how long a fleet with minReplicas 0 stays warm while idle, and its memory of idle gaps.

Keeping the last replica through an idle gap costs its GPU time; letting it go costs a cold start when the gap ends:
the new replica's GPU time while it starts, and the first requests held that long in the endpoint picker. It is a
rent-or-buy choice (ski rental), priced in replica-seconds: a cold start of L costs ``L * (1 + WAIT_PRICE)``, its GPU
time plus ``WAIT_PRICE`` replica-seconds per second the first request waits beyond its SLO's reach.

- With fewer than ``MIN_GAPS`` idle gaps seen, the fleet waits that price before going to zero: whatever the gap,
  never more than twice the cost of the best choice in hindsight (Karlin, Manasse, Rudolph and Sleator, "Competitive
  snoopy caching", Algorithmica 1988).
- With more, it waits the time that would have cost least over the gaps it has seen (each gap shorter than the wait
  costs its length; each longer one the wait plus a cold start); ties go to the longer wait, so a fleet whose gaps
  are all short never goes to zero on their account. The optimum over a set of gaps is at 0 or at one of their
  lengths, so only those are tried.

A gap is the time from the first cycle that sees the fleet idle (no request finished over the rate window, none in
flight, none held by the picker) to the first that sees a request again; gaps shorter than the rate window are never
seen, and never need to be: the fleet stays warm through them. A gap already going on when this memory began (an
operator restart, a new leader) is timed from then, so it may go to zero sooner, but is not learned: its length is
not known.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from mmfleet.api import duration_text

WAIT_PRICE = 10.0  # replica-seconds one second of the first request's wait on a cold start is worth
MIN_GAPS = 5  # idle gaps seen before they, rather than the price alone, set the wait
GAPS_KEPT = 64  # the most recent idle gaps remembered


@dataclass(frozen=True)
class IdleMemory:
    """What a zero-capable fleet remembers of its idleness (in the operator's memory only)."""

    since: float | None = None  # when the current idle gap was first seen; None while requests come
    gaps: tuple[float, ...] = ()  # lengths of the last idle gaps that ended, s
    began: float | None = None  # the first cycle this memory saw: a gap seen from then may have begun before

    def seen(self, idle: bool, now: float) -> IdleMemory:
        """This cycle's verdict: a gap starts, goes on, or ends (and is remembered, if its start was seen)."""
        began = now if self.began is None else self.began
        if idle:
            return IdleMemory(now if self.since is None else self.since, self.gaps, began)
        if self.since is None or self.since <= began:
            return IdleMemory(None, self.gaps, began)
        return IdleMemory(None, (*self.gaps, now - self.since)[-GAPS_KEPT:], began)

    def idle_for(self, now: float) -> float:
        """Seconds of the current gap so far; 0 while requests come."""
        return 0.0 if self.since is None else now - self.since


def cold_start_price(cold_start: float) -> float:
    """What one cold start costs, in replica-seconds."""
    return cold_start * (1.0 + WAIT_PRICE)


def expected_cost(wait: float, gaps: tuple[float, ...], price: float) -> float:
    """Mean replica-seconds per gap of waiting ``wait`` before going to zero, over ``gaps``."""
    return statistics.fmean(gap if gap <= wait else wait + price for gap in gaps)


@dataclass(frozen=True)
class IdleRule:
    """The wait before the last replica goes, and why, for status and events."""

    wait: float  # s of idleness
    why: str


def idle_rule(after: str, gaps: tuple[float, ...], cold_start: float, fixed: float | None) -> IdleRule:
    """``after`` is spec.autoscaling.scaleToZero.after; ``fixed`` its seconds when it is a duration."""
    if fixed is not None:
        return IdleRule(fixed, f"scaleToZero.after {after}")
    price = cold_start_price(cold_start)
    priced = f"a cold start of {duration_text(cold_start)} priced at {duration_text(price)} of one replica"
    if len(gaps) < MIN_GAPS:
        return IdleRule(price, f"auto: {priced}; {len(gaps)} idle gaps seen, fewer than {MIN_GAPS} to learn from")
    wait = min((0.0, price, *gaps), key=lambda w: (expected_cost(w, gaps, price), -w))
    median = duration_text(statistics.median(gaps))
    return IdleRule(wait, f"auto: the cheapest wait over the last {len(gaps)} idle gaps (median {median}), {priced}")
