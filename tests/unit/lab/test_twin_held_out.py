"""The twin against the real vLLM 0.33.0 server on data its overheads were not fitted on (issue 25).

The split is ``mmfleet_lab.twin.calibrate``'s, fixed before any result was looked at. Each held-out phase
below saturation must have real / twin e2e P50 and P90 within 0.9-1.1 with the shipped parameters. Since issue 27
the image phases of the default server start are what the encoder's launch and the API pass were fitted on
(``calibrate_mm``), and the processor-cache-off ones were used to reject one variant of the fit (docs/twin.md calls
them validation); the image phases the twin misses (``docs/twin.md``,
"Images") are strict expected failures: the day they pass, the mark must go.
"""

from __future__ import annotations

import functools

import pytest

from mmfleet_lab.twin import H200_QWEN25VL7B as P
from mmfleet_lab.twin import ReplicaParams
from mmfleet_lab.twin.calibrate import Phase, e2e_ratios, fit, held_out
from tests.helpers.repo import DATA

BAND = (0.9, 1.1)
MISSED = pytest.mark.xfail(strict=True, reason="the twin with images misses here (docs/twin.md, Images)")
IMAGES_MISSED = {
    "image 448x448 20 req/s (default)",
    "image 448x448 10 req/s (mm_cache_off)",
    "image 448x448 20 req/s (mm_cache_off)",
    "image 1280x720 5 req/s (mm_cache_off)",
}


@functools.cache
def phases() -> dict[str, Phase]:
    return {p.name: p for p in held_out(DATA)}


@functools.cache
def fitted() -> ReplicaParams:
    return fit(P, DATA)


def within(params: ReplicaParams, phase: Phase) -> bool:
    return all(BAND[0] <= r <= BAND[1] for r in e2e_ratios(params, phase))


@pytest.mark.parametrize("name", [pytest.param(n, marks=MISSED) if n in IMAGES_MISSED else n for n in phases()])
def test_held_out_e2e_within_band(name: str) -> None:
    p50, p90 = e2e_ratios(P, phases()[name])
    print(f"{name}: real / twin e2e P50 {p50:.2f}, P90 {p90:.2f}")
    assert BAND[0] <= p50 <= BAND[1] and BAND[0] <= p90 <= BAND[1], (p50, p90)


def test_fitted_overheads_are_shipped_only_if_they_pass_held_out() -> None:
    """The fit on the fit part is reproducible, and replaces the shipped overheads only if it passes held
    out on the phases the twin can model (text and batch 1); it does not at 20 req/s (docs/twin.md)."""
    f = fitted()
    print(f"fitted: host_ms_base {f.host_ms_base}, host_ms_per_seq {f.host_ms_per_seq}, "
          f"request_overhead_s {f.request_overhead_s}")  # fmt: skip
    assert (f.host_ms_base, f.host_ms_per_seq, f.request_overhead_s) == pytest.approx((0.171, 0.0225, 0.0525))
    passes = all(within(f, p) for name, p in phases().items() if not name.startswith("image"))
    shipped = (P.host_ms_base, P.host_ms_per_seq, P.request_overhead_s) == (
        f.host_ms_base,
        f.host_ms_per_seq,
        f.request_overhead_s,
    )
    assert passes == shipped
