"""capacity_at_slo (mu_SLO) and the named scenarios, on the trace slices in tests/data."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from mmfleet.api import SloSpec
from mmfleet_lab.twin import H100_QWEN25VL7B, H200_QWEN25VL7B, capacity_at_slo, scenario, traffic
from mmfleet_lab.twin.scenarios import AZURE_CODE, AZURE_CONV, TRACES, traces_dir
from mmfleet_lab.twin.sim import probe_latency
from mmfleet_lab.twin.types import Requests
from tests.helpers.repo import DATA, ROOT


def mix() -> Requests:
    req = traffic.load_azure(DATA / "azure2023_AzureLLMInferenceTrace_conv.csv")
    return traffic.add_images(
        req, traffic.load_token_stats(DATA / "servegen_client_token_stats_6h.csv"), np.random.default_rng(0)
    )


def test_capacity_is_monotone_in_the_target() -> None:
    req = mix()
    caps = [capacity_at_slo(H200_QWEN25VL7B, req, SloSpec(target=t)) for t in ("3s", "8s", "15s")]
    print("mu_SLO (req/s) at e2e P90 3/8/15 s:", [round(c, 2) for c in caps])
    assert caps[0] > 0
    assert all(a <= b for a, b in itertools.pairwise(caps)), caps
    assert caps[-1] > caps[0]
    # the answer holds: at mu the percentile meets the target, 25% above it does not
    mu = caps[1]
    assert probe_latency(H200_QWEN25VL7B, req, SloSpec(target="8s"), mu) <= 8.0
    assert probe_latency(H200_QWEN25VL7B, req, SloSpec(target="8s"), mu * 1.25) > 8.0


def test_capacity_depends_on_the_gpu_and_the_metric() -> None:
    req = mix()
    slo = SloSpec(target="8s")
    h200 = capacity_at_slo(H200_QWEN25VL7B, req, slo)
    h100 = capacity_at_slo(H100_QWEN25VL7B, req, slo)
    assert h100 < h200
    assert capacity_at_slo(H200_QWEN25VL7B, req, SloSpec(metric="ttft", target="1ms")) == 0.0


def test_scenarios_from_slices() -> None:
    sc = scenario("spike-x4", replicas=3, traces_dir=DATA, seed=1, rate=30.0)
    assert sc.name == "spike-x4" and sc.duration == 300.0
    ((onset, end),) = sc.spikes
    assert onset == 100.0 and end == 300.0  # 10 min would pass the slice's end: cut there
    base = scenario("azure-conv", replicas=3, traces_dir=DATA, seed=1)
    assert base.spikes == ()
    mu = float(base.info["mu_slo"])
    assert len(base.requests) / base.duration == pytest.approx(3 * mu, rel=0.1)
    flat = scenario("azure-conv", traces_dir=DATA, seed=1, rate=30.0)
    before = np.sum(sc.requests.arrival < onset) / np.sum(flat.requests.arrival < onset)
    during = np.sum(sc.requests.arrival >= onset) / np.sum(flat.requests.arrival >= onset)
    assert before == pytest.approx(1.0, abs=0.05) and during == pytest.approx(4.0, rel=0.15)
    assert len(sc.requests) == pytest.approx(30.0 * 300 + 3 * 30.0 * 200, rel=0.1)
    mm = scenario("servegen-mm", traces_dir=DATA, rate=5.0)
    assert mm.duration == 3600.0 and len(mm.requests) == pytest.approx(5.0 * 3600, rel=0.05)
    with_images = mm.requests.images > 0
    assert np.mean(with_images) > 0.5 and np.median(mm.requests.tokens_per_image[with_images]) > 100
    with pytest.raises(ValueError, match="unknown scenario"):
        scenario("nope", traces_dir=DATA)
    with pytest.raises(FileNotFoundError, match="AzurePublicDataset"):
        scenario("azure-code", traces_dir=DATA / "missing")


def test_traces_default_to_the_packages_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the repository: the 300 s slices in tests/data are the first rows of the package's hour."""
    monkeypatch.delenv("MMFLEET_TRACES", raising=False)
    assert traces_dir() == TRACES and TRACES.is_relative_to(ROOT)
    for name in (AZURE_CONV, AZURE_CODE):
        whole, head = (traffic.load_azure(d / name) for d in (TRACES, DATA))
        assert len(whole) > 10 * len(head) and np.array_equal(whole.arrival[: len(head)], head.arrival)
    monkeypatch.setenv("MMFLEET_TRACES", str(DATA))
    assert traces_dir() == DATA and traces_dir(Path("/x")) == Path("/x")


def test_bursts_come_on_top_of_the_base_after_five_minutes_each_short_and_seeded() -> None:
    flat = scenario("azure-conv", seed=3, rate=30.0)
    bursty = scenario("bursts", seed=3, rate=30.0)
    assert bursty.spikes == ()  # scored as a steady hour
    extra = np.setdiff1d(bursty.requests.arrival, flat.requests.arrival)
    assert len(extra) == len(bursty.requests) - len(flat.requests) > 0  # the base is untouched
    assert extra.min() >= 300.0
    # Runs of extra arrivals separated by quiet gaps: each burst lasts 20-60 s (two may touch), several in the hour.
    runs = np.split(extra, np.flatnonzero(np.diff(extra) > 5.0) + 1)
    lengths = [run[-1] - run[0] for run in runs]
    assert 8 <= len(runs) <= 30, len(runs)
    assert all(length >= 15.0 for length in lengths), lengths
    assert sum(length <= 60.0 for length in lengths) >= 0.9 * len(lengths), lengths
    again, other = (scenario("bursts", seed=s, rate=30.0).requests.arrival for s in (3, 4))
    assert np.array_equal(again, bursty.requests.arrival) and not np.array_equal(other[-50:], again[-50:])


@pytest.mark.parametrize(
    ("name", "field"), [("outputs-x2", "output_tokens"), ("prompts-x2", "input_tokens"), ("images-x2", "images")]
)
def test_a_mix_shift_doubles_one_kind_of_tokens_from_twenty_minutes_on_and_nothing_else(name: str, field: str) -> None:
    """Issue 25's "another token mix": the same arrivals, each later request heavier; scored like a spike to the end."""
    flat = scenario("azure-conv", seed=3, rate=30.0)
    shifted = scenario(name, seed=3, rate=30.0)
    before, after = (getattr(s.requests, field) for s in (flat, shifted))
    onset = min(1200.0, shifted.duration / 3.0)  # twenty minutes in, or a third of a shorter trace
    later = flat.requests.arrival >= onset
    assert np.array_equal(shifted.requests.arrival, flat.requests.arrival)
    assert np.array_equal(after[~later], before[~later]) and np.array_equal(after[later], 2 * before[later])
    for other in {"input_tokens", "output_tokens", "images"} - {field}:
        assert np.array_equal(getattr(shifted.requests, other), getattr(flat.requests, other)), other
    assert shifted.requests.image_tokens is None or np.array_equal(
        shifted.requests.image_tokens, flat.requests.image_tokens
    )  # an image is as large as before: there are more of them
    assert shifted.spikes == ((onset, shifted.duration),) and later.any() and not later.all()
    on_code = scenario(f"{name}@azure-code", seed=3, rate=30.0)
    assert on_code.info["base"] == "azure-code" and on_code.spikes == (
        (min(1200.0, on_code.duration / 3.0), on_code.duration),
    )
