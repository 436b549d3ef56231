"""``mmfleet twin serve`` without a cluster: the exposition, traffic, pods and a fleet's replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mmfleet.backends import tensorrt_llm, vllm
from mmfleet.cli import main
from mmfleet_lab.twin.observe import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    LAYOUT,
    REQUEST_TOKEN_BUCKETS,
    TTFT_BUCKETS,
    MetricBook,
)
from mmfleet_lab.twin.replica import H100_QWEN25VL7B
from mmfleet_lab.twin.serve import FleetTwin, PodView, Spike, TrafficSpec, build_requests, exposition, pod_view
from tests.helpers.repo import DATA


def book_with_traffic() -> np.ndarray:
    book = MetricBook()
    rid = book.add_replica()
    book.observe("e2e", rid, np.array([0.2, 0.9, 1.7, 12.0, 9000.0]))
    book.observe("ttft", rid, np.array([0.05, 0.3]))
    book.observe("itl", rid, np.repeat([0.02, 0.04], [10, 5]))  # one per generated token
    book.add(LAYOUT.success, rid, 5.0)
    book.add(LAYOUT.prompt, rid, 4321.0)
    book.add(LAYOUT.generation, rid, 99.5)
    book.observe("request_prompt", rid, np.array([800.0, 900.0, 1200.0, 1321.0, 100.0]))
    book.observe("request_generation", rid, np.array([20.0, 20.0, 19.5, 20.0, 20.0]))
    return book.export(rid)


def families(text: bytes) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def samples(family: Any, suffix: str = "") -> list[Any]:
    return [s for s in family.samples if s.name == family.name + suffix]


def test_vllm_exposition_has_the_names_types_labels_and_buckets_of_vllm_0_33() -> None:
    text = exposition("vllm", "qwen-vl", book_with_traffic(), (3.0, 2.0, 0.25))
    found = families(text)
    m = vllm.BACKEND.metrics
    # The parser names counter families without _total; its samples carry it, as Prometheus stores them.
    assert {name: f.type for name, f in found.items()} == {
        m.running: "gauge",
        m.waiting: "gauge",
        m.kv_cache_usage: "gauge",
        m.requests_finished.removesuffix("_total"): "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        m.e2e: "histogram",
        m.ttft: "histogram",
        m.itl: "histogram",
        vllm.REQUEST_PROMPT_TOKENS: "histogram",
        vllm.REQUEST_GENERATION_TOKENS: "histogram",
    }
    assert "_created" not in text.decode()
    for family in found.values():
        for sample in family.samples:
            assert sample.labels["model_name"] == "qwen-vl" and sample.labels["engine"] == "0", sample
    assert [s.value for s in samples(found[m.running])] == [3.0]
    assert [s.value for s in samples(found[m.waiting])] == [2.0]
    assert [s.value for s in samples(found[m.kv_cache_usage])] == [0.25]
    success = {s.labels["finished_reason"]: s.value for s in samples(found["vllm:request_success"], "_total")}
    assert success == {"stop": 5.0, "length": 0.0, "abort": 0.0, "error": 0.0, "repetition": 0.0}
    assert [s.value for s in samples(found["vllm:prompt_tokens"], "_total")] == [4321.0]
    assert [s.value for s in samples(found["vllm:generation_tokens"], "_total")] == [99.5]
    for name, bounds in (
        (m.e2e, E2E_BUCKETS),
        (m.ttft, TTFT_BUCKETS),
        (m.itl, ITL_BUCKETS),
        (vllm.REQUEST_PROMPT_TOKENS, REQUEST_TOKEN_BUCKETS),
        (vllm.REQUEST_GENERATION_TOKENS, REQUEST_TOKEN_BUCKETS),
    ):
        buckets = samples(found[name], "_bucket")
        assert [float(s.labels["le"]) for s in buckets] == [*bounds, float("inf")]
        counts = [s.value for s in buckets]
        assert counts == sorted(counts)  # cumulative
        assert counts[-1] == samples(found[name], "_count")[0].value
    e2e = [s.value for s in samples(found[m.e2e], "_bucket")]
    assert e2e[0] == 1.0 and e2e[3] == 2.0 and e2e[-2] == 4.0 and e2e[-1] == 5.0  # le=0.3, le=1, le=7680, +Inf
    assert samples(found[m.e2e], "_sum")[0].value == pytest.approx(0.2 + 0.9 + 1.7 + 12.0 + 9000.0)
    assert samples(found[m.itl], "_count")[0].value == 15.0
    # the mix of the requests that finished: _sum over _count, what the autoscaler reads
    prompt = found[vllm.REQUEST_PROMPT_TOKENS]
    assert samples(prompt, "_sum")[0].value / samples(prompt, "_count")[0].value == pytest.approx(4321.0 / 5)
    assert samples(found[vllm.REQUEST_GENERATION_TOKENS], "_sum")[0].value == 99.5


def test_tensorrt_llm_exposition_uses_its_own_names_and_labels() -> None:
    found = families(exposition("tensorrt-llm", "llama", book_with_traffic(), (1.0, 0.0, 0.5)))
    m = tensorrt_llm.BACKEND.metrics
    assert set(found) == {
        m.running,
        m.waiting,
        m.kv_cache_usage,
        m.requests_finished.removesuffix("_total"),
        "trtllm_prompt_tokens",
        "trtllm_generation_tokens",
        m.e2e,
        m.ttft,
        m.itl,
    }
    assert found[m.itl].type == "histogram" and m.itl == "trtllm_time_per_output_token_seconds"
    sample = samples(found["trtllm_request_success"], "_total")[0]
    assert sample.labels == {"model_name": "llama", "engine_type": "pytorch", "finished_reason": "stop"}
    assert sample.value == 5.0


@pytest.mark.parametrize(
    ("text", "spike"), [("60:180:4", Spike(60.0, 180.0, 4.0)), ("0:30.5:0.5", Spike(0.0, 30.5, 0.5))]
)
def test_spikes_parse(text: str, spike: Spike) -> None:
    assert Spike.parse(text) == spike


@pytest.mark.parametrize(
    ("text", "says"),
    [("60:180", "START:END:FACTOR"), ("a:b:c", "START:END:FACTOR"), ("90:60:2", "below END"), ("0:60:0", "FACTOR")],
)
def test_bad_spikes_name_the_value_and_the_form(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as error:
        Spike.parse(text)
    assert repr(text) in str(error.value)


def test_bad_traffic_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--scenario 'nope': choose from poisson, azure-conv"):
        TrafficSpec(name="nope")
    with pytest.raises(ValueError, match="--rate 0: must be more than 0"):
        TrafficSpec(rate=0)


def test_poisson_traffic_follows_the_rate_and_the_spike() -> None:
    spec = TrafficSpec(rate=5.0, duration=600.0, spikes=(Spike(200.0, 400.0, 3.0),), traces=DATA)
    req = build_requests(spec, "ns/fleet")
    t = req.arrival
    assert np.all(np.diff(t) >= 0) and t[-1] < 600.0
    before, during, after = ((t >= a) & (t < b) for a, b in ((0, 200), (200, 400), (400, 600)))
    assert before.sum() / 200 == pytest.approx(5.0, rel=0.15)
    assert during.sum() / 200 == pytest.approx(15.0, rel=0.15)
    assert after.sum() / 200 == pytest.approx(5.0, rel=0.15)
    assert np.mean(req.images > 0) > 0.5  # ServeGen's multimodal mix
    other = build_requests(spec, "ns/other-fleet")
    assert not np.array_equal(other.arrival[:10], t[:10])  # each fleet draws its own arrivals
    assert np.array_equal(build_requests(spec, "ns/fleet").arrival, t)  # and the same ones every run


def test_a_dip_thins_the_arrivals_of_a_named_scenario() -> None:
    spec = TrafficSpec(name="azure-conv", rate=10.0, duration=300.0, spikes=(Spike(100.0, 200.0, 0.25),), traces=DATA)
    t = build_requests(spec, "ns/fleet").arrival
    inside = np.sum((t >= 100) & (t < 200))
    outside = np.sum(t < 100)
    assert inside / outside == pytest.approx(0.25, abs=0.1)


def api_pod(name: str, *, ready: bool, deleting: bool = False, backend: str | None = "vllm") -> dict[str, Any]:
    labels = {"mmfleet.io/inference": "qwen"}
    if backend:
        labels["app.kubernetes.io/name"] = backend
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "containers": [{"name": "server", "command": ["vllm", "serve", "m", "--served-model-name", "qwen-vl"]}]
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_pod_view_reads_readiness_deletion_backend_and_served_name() -> None:
    pod = pod_view(api_pod("a", ready=True))
    assert pod == PodView("ml", "a", "uid-a", "qwen", "vllm", "qwen-vl", ready=True, deleting=False)
    assert pod.serving
    assert not pod_view(api_pod("b", ready=True, deleting=True)).serving
    assert not pod_view(api_pod("c", ready=False)).serving
    trt = api_pod("d", ready=True, backend="tensorrt-llm")
    trt["spec"]["containers"][0]["command"] = ["trtllm-serve", "serve", "m", "--served_model_name=llama"]
    assert (pod_view(trt).backend, pod_view(trt).model_name) == ("tensorrt-llm", "llama")
    bare = api_pod("e", ready=True, backend=None)
    bare["spec"]["containers"][0]["command"] = []
    assert (pod_view(bare).backend, pod_view(bare).model_name) == ("vllm", "qwen")  # the fleet's name


def test_fleet_serves_only_from_ready_pods_and_drops_when_none_serves() -> None:
    req = build_requests(TrafficSpec(rate=4.0, duration=60.0, traces=DATA), "ml/qwen")
    fleet = FleetTwin("ml", "qwen", req, H100_QWEN25VL7B, now=0.0)
    fleet.sync([pod_view(api_pod("a", ready=False))])
    fleet.advance(10.0)
    assert fleet.metrics("a") is None  # still loading: no /metrics, no target
    assert fleet.targets("127.0.0.1:1") == []
    dropped = fleet.dropped
    assert dropped == np.sum(req.arrival < 10.0)  # nobody served them
    fleet.sync([pod_view(api_pod("a", ready=True)), pod_view(api_pod("b", ready=False))])
    fleet.advance(30.0)
    assert fleet.dropped == dropped
    served = families(fleet.metrics("a") or b"")["vllm:request_success"]
    assert samples(served, "_total")[0].value > 0.8 * np.sum((req.arrival >= 10.0) & (req.arrival < 28.0))
    assert [t.pod for t in fleet.targets("127.0.0.1:1")] == ["a"]
    # b turns Ready, a is being deleted: new requests go to b only, a keeps its metrics while it exists
    fleet.sync([pod_view(api_pod("a", ready=True, deleting=True)), pod_view(api_pod("b", ready=True))])
    a_before = samples(families(fleet.metrics("a") or b"")["vllm:request_success"], "_total")[0].value
    fleet.advance(50.0)
    a_after = samples(families(fleet.metrics("a") or b"")["vllm:request_success"], "_total")[0].value
    b_done = samples(families(fleet.metrics("b") or b"")["vllm:request_success"], "_total")[0].value
    assert a_after - a_before < 10  # only what it held
    assert b_done > 0.8 * np.sum((req.arrival >= 30.0) & (req.arrival < 48.0))
    fleet.sync([pod_view(api_pod("b", ready=True))])  # a is gone
    assert fleet.metrics("a") is None
    assert [t.pod for t in fleet.targets("127.0.0.1:1")] == ["b"]


def test_requests_before_a_fleet_appears_are_not_replayed() -> None:
    req = build_requests(TrafficSpec(rate=4.0, duration=60.0, traces=DATA), "ml/qwen")
    fleet = FleetTwin("ml", "qwen", req, H100_QWEN25VL7B, now=40.0)
    fleet.sync([pod_view(api_pod("a", ready=True))])
    fleet.advance(45.0)
    running, waiting = (
        samples(families(fleet.metrics("a") or b"")[name])[0].value
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
    )
    assert running + waiting < 10  # not the 160 that arrived before it was seen


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["--spike", "60:180"], 2, "--spike '60:180': expected START:END:FACTOR"),
        (["--rate", "-1"], 2, "--rate -1: must be more than 0"),
        (["--cluster", "nope"], 1, "no cluster named nope; start one with: mmfleet cluster up --name nope"),
    ],
)
def test_twin_serve_refuses_bad_input_in_one_line(
    argv: list[str],
    code: int,
    says: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("MMFLEET_CACHE", str(tmp_path))  # no recorded clusters
    assert main(["twin", "serve", "--traces", str(DATA), *argv]) == code
    err = capsys.readouterr().err
    assert err.startswith("mmfleet twin serve: ") and says in err and len(err.splitlines()) == 1, err


def test_vllm_exposition_matches_the_real_servers() -> None:
    """Every series the twin exports for vLLM is in the real 0.33.0 server's /metrics with the same
    type, label names, finish reasons and bucket bounds (``tests/data/vllm_h200_metrics_0.33.0.txt``)."""
    real = families((DATA / "vllm_h200_metrics_0.33.0.txt").read_bytes())
    twin = families(exposition("vllm", "qwen", book_with_traffic(), (1.0, 2.0, 0.5)))
    assert len(twin) == 11
    for name, fam in twin.items():
        assert real[name].type == fam.type, name
        for suffix in {s.name[len(name) :] for s in fam.samples}:
            keys = {tuple(sorted(s.labels.items())) for s in samples(fam, suffix)}
            real_keys = {tuple(sorted(s.labels.items())) for s in samples(real[name], suffix)}
            assert keys == real_keys, (name, suffix)
