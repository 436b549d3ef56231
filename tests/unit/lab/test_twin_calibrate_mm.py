"""The twin with images against the real vLLM 0.33.0 server (issue 27; ``mmfleet_lab.twin.calibrate_mm``).

The encoder's launch and the API pass are fitted on the default server start and checked on the start with the
processor cache off (validation). Each cell below saturation has its metrics (real / twin TTFT and e2e, P50 and P90)
pinned in or out of the goal's band 0.9-1.1 with the shipped parameters: a change that moves one across fails here,
and ``docs/twin.md`` ("Images") must follow it. So are, loosely, the figures not fitted on: the time before the
engine, TPOT at 20 req/s and the API process's CPU.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from mmfleet_lab.twin import H200_QWEN25VL7B as P
from mmfleet_lab.twin.calibrate_mm import BAND, METRICS, Cell, cells, fit, ratios, timings
from tests.helpers.repo import DATA

E2E = ("e2e_p50", "e2e_p90")
# The metrics within the band, per cell; the others miss it (docs/twin.md, "Images").
MET = {
    "default: batch 1, 1 x 1280x720": E2E,
    "default: batch 1, 2 x 1280x720": E2E,
    "default: batch 1, 4 x 1280x720": E2E,
    "default: batch 1, text only": E2E,
    "default: batch 1, 1 x 448x448": ("ttft_p90", *E2E),
    "default: batch 1, 2 x 448x448": E2E,
    "default: batch 1, 4 x 448x448": E2E,
    "mm_cache_off: batch 1, 1 x 1280x720": E2E,
    "mm_cache_off: batch 1, 2 x 1280x720": E2E,
    "mm_cache_off: batch 1, 4 x 1280x720": E2E,
    "mm_cache_off: batch 1, text only": ("ttft_p90", *E2E),
    "mm_cache_off: batch 1, 1 x 448x448": E2E,
    "mm_cache_off: batch 1, 2 x 448x448": ("ttft_p90", *E2E),
    "mm_cache_off: batch 1, 4 x 448x448": E2E,
    "default: 2 req/s, 1 x 448x448": ("ttft_p50", *E2E),
    "default: 5 req/s, 1 x 448x448": ("ttft_p50", *E2E),
    "default: 10 req/s, 1 x 448x448": ("ttft_p50", *E2E),
    "default: 20 req/s, 1 x 448x448": ("ttft_p50", "e2e_p50"),
    "mm_cache_off: 10 req/s, 1 x 448x448": ("e2e_p90",),
    "mm_cache_off: 20 req/s, 1 x 448x448": ("ttft_p50", "e2e_p50"),
    "mm_cache_off: 5 req/s, 1 x 1280x720": (),
}


@functools.cache
def below_saturation() -> dict[str, Cell]:
    return {c.name: c for c in cells(DATA) if not c.overload}


def test_every_cell_below_saturation_is_pinned() -> None:
    assert set(below_saturation()) == set(MET)


@pytest.mark.parametrize("name", sorted(MET))
def test_ratios_in_the_band_where_met_and_out_where_missed(name: str) -> None:
    r = ratios(P, below_saturation()[name])
    print(name, {k: round(v, 3) for k, v in r.items()})
    inside = {k for k in METRICS if BAND[0] <= r[k] <= BAND[1]}
    assert inside == set(MET[name]), r


def test_the_fit_gives_the_shipped_launch_and_pass() -> None:
    """The grid fit on the default start, from another starting point, lands on ``ENCODER_LAUNCH_MS`` and
    ``API_PASS_MS``."""
    f = fit(replace(P, encoder_launch_ms=(0.0, 0.0), api_pass_ms=0.0), DATA)
    assert (f.encoder_launch_ms, f.api_pass_ms) == (P.encoder_launch_ms, P.api_pass_ms)


def test_before_the_engine_the_twin_is_slow_and_the_api_process_is_not_busy() -> None:
    """Below saturation the twin takes 1.1-1.7x the server's mean time from arrival to the engine's queue (real / twin
    0.67-0.87 with the shipped parameters) while from there to the first token it is faster at 10 and 20 req/s; its
    TPOT P50 at 20 req/s is 1.05-1.2x the server's (22.7 against 20.7 and 20.8 ms), and the server's API process used
    under half a core (a check of the data): the API pass is a fitted wait, not its CPU work."""
    below = [(c, t) for c, t in timings(P, DATA) if not c.overload]
    assert len(below) == 7
    for c, t in below:
        assert 0.6 < t.before_real / t.before_twin < 0.9, (c.name, t)
        assert t.api_cores < 0.5, (c.name, t)
    at20 = [t for c, t in below if c.rate == 20.0]
    assert len(at20) == 2
    assert all(0.85 < t.tpot_real / t.tpot_twin < 0.95 for t in at20), at20
    # and from the engine's queue to the first token it is fast under load: the two offset in its TTFT
    loaded = [(c.name, t) for c, t in below if c.server == "default" and c.rate >= 10.0]
    assert len(loaded) == 2 and all(t.engine_twin < t.engine_real for _, t in loaded), loaded
