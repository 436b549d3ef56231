"""``mmfleet bench encode``: its workloads, the image-only spike, the shipped encode-tier policy it runs, and a tiny
run's tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmfleet_lab.bench import encode


def test_the_workloads_draw_images_as_named() -> None:
    heavy = encode.workload("azure-conv", "image-heavy", 10.0, 300.0, 0).requests
    mixed = encode.workload("azure-conv", "mixed", 10.0, 300.0, 0).requests
    sparse = encode.workload("azure-conv", "sparse-small", 10.0, 300.0, 0).requests
    assert np.all(heavy.images >= 1)
    assert 0.2 < np.mean(mixed.images > 0) < 0.4
    assert 0.05 < np.mean(sparse.images > 0) < 0.15
    assert set(sparse.images.tolist()) == {0.0, 1.0}
    assert set(sparse.tokens_per_image[sparse.images > 0].tolist()) == {256.0}, "one 448x448 image"
    assert heavy.arrival.max() < 300.0 and abs(len(heavy) / 300.0 - 10.0) < 2.0


def test_the_image_only_spike_adds_image_requests_in_its_window_only() -> None:
    base = encode.workload("azure-conv", "mixed", 10.0, 1200.0, 0)
    spiked = encode.image_spike(base, 600.0, 900.0, 4.0, 0)
    b, s = base.requests, spiked.requests
    assert np.count_nonzero(s.images == 0) == np.count_nonzero(b.images == 0), "text unchanged"
    assert np.all(np.diff(s.arrival) >= 0)

    def images_in(req: encode.Requests, lo: float, hi: float) -> int:
        return int(np.count_nonzero((req.images > 0) & (req.arrival >= lo) & (req.arrival < hi)))

    assert images_in(s, 0.0, 600.0) == images_in(b, 0.0, 600.0)
    ratio = images_in(s, 600.0, 900.0) / images_in(b, 600.0, 900.0)
    assert 3.0 < ratio < 5.5, ratio
    assert spiked.spikes == ((600.0, 900.0),)


def test_e_pd_grows_its_encode_tier_under_an_image_spike_and_its_serving_tier_less_than_aggregated() -> None:
    """The shipped policies under the bench's image-only spike: the encode tier (``decide_encode`` itself, its reason
    naming its share of the target) grows during the spike; E/PD's serving tier grows by fewer replicas than the
    aggregated fleet does, since the images' encoding left it."""
    rate = 2.0 * encode.capacity("servegen-language")
    agg = encode.run_autoscaled("servegen-language", "mixed", "aggregated", rate, 0, True)
    scn, res = encode.autoscaled("servegen-language", "mixed", "E/PD", rate, 0, True)
    epd = encode.score("E/PD", scn, "", rate, 0, res)
    assert epd.encode_during > epd.encode_before
    assert epd.serving_during - epd.serving_before < agg.serving_during - agg.serving_before
    assert any(t >= encode.SPIKE[0] and n > 1 for t, n in res.encode_decisions)
    assert res.encode_gpu_seconds > 0 and agg.encode_gpu_hours == 0.0


def test_the_encode_policy_is_decide_encode_with_the_shipped_share() -> None:
    rate = 2.0 * encode.capacity("servegen-language")
    seen: list[encode.ShippedEncode] = []
    original = encode.ShippedEncode

    class Kept(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            seen.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(encode, "ShippedEncode", Kept)
        encode.autoscaled("servegen-language", "mixed", "E/PD", rate, 0, True)
    assert seen and seen[0].reasons
    assert all("(encode tier: 25% of 1s)" in why for _, _, why in seen[0].reasons)
    assert seen[0].inference.spec.serving_slo_target == pytest.approx(0.75)


def test_a_tiny_run_writes_its_section_with_one_row_per_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encode, "SWEEP_LOADS", (0.1, 0.3))
    monkeypatch.setattr(encode, "WORKLOADS", ("mixed", "sparse-small"))
    monkeypatch.setattr(encode, "AUTOSCALE_WORKLOADS", ("mixed",))
    monkeypatch.setattr(encode, "FLEETS", ((2, (1, 1)),))
    monkeypatch.setattr(encode, "DURATION", 400.0)
    monkeypatch.setattr(encode, "SPLIT_TRACES", {"test": ("servegen-language",)})
    docs = tmp_path / "benchmarks.md"
    assert encode.main(docs, lambda _: None, [0]) == 0
    text = docs.read_text()
    assert "## The encode tier: aggregated against E/PD (digital twin)" in text
    assert "Command: `mmfleet bench encode --seed 0`" in text
    section = text.split("### servegen-language")[1]
    fixed = section.split("Fixed fleets")[1].split("\n\n")[1].splitlines()
    assert len(fixed) == 2 + 2 * 2, "header, rule, and one row per workload x load (one fleet pair)"
    assert all(row.count("|") == fixed[0].count("|") for row in fixed)
    assert "| mixed " in fixed[2] and "| 2 / 1+1 " in fixed[2]
    assert "mmfleet aggregated" in section and "mmfleet E/PD" in section
    assert "E/PD meets fewer windows in" in section
