"""A new replica's cold start, phase by phase, from the timestamps Kubernetes records: what status shows, what the
operator's metrics observe once per pod, and the whole the autoscaler plans with; within the last phase, what the
server's own log says."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from mmfleet import metrics_export
from mmfleet.autoscaler.cycle import PHASES, ColdStart, Memory, Pods, Seen, count_pods, decide, with_server
from mmfleet.autoscaler.metrics import Signals
from mmfleet.backends import ServerStartup, tensorrt_llm, vllm
from mmfleet.handlers import autoscale
from mmfleet.handlers.records import FleetRecord
from mmfleet.kube import RetryableError
from mmfleet.status import Observed, compute_status
from mmfleet.validation import parse
from tests.helpers.autoscaler import INTERVAL, T0, fleet
from tests.helpers.operator_state import KEY, RecordingKube, fleet_body, operator

CREATED = "2026-12-01T00:00:00Z"


def at(seconds: float) -> str:
    return (T0.replace(year=2026, month=12, day=1, hour=0, minute=0) + timedelta(seconds=seconds)).isoformat()


def pod(name: str, scheduled: float, initialized: float, running: float | None, ready: float) -> dict[str, Any]:
    """A Ready pod of the server: scheduled, initialized, its container running and Ready at these seconds after
    creation."""
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": at(scheduled)},
            {"type": "Initialized", "status": "True", "lastTransitionTime": at(initialized)},
            {"type": "Ready", "status": "True", "lastTransitionTime": at(ready)},
        ],
        "containerStatuses": [{"name": "vllm", "state": {"running": {"startedAt": at(running)}} if running else {}}],
    }
    return {"metadata": {"name": name, "creationTimestamp": CREATED}, "status": status}


def test_each_ready_pod_is_split_into_the_phases_kubernetes_timestamps() -> None:
    pods = count_pods([pod("a", 2, 5, 45, 140), pod("b", 4, 6, 65, 150), pod("c", 3, 3, 40, 120)])
    by_pod = {s.pod: s for s in pods.starts}
    assert by_pod["a"].total == 140
    assert by_pod["a"].phases == (2, 3, 40, 95), "scheduled, initialized, image pulled and started, loaded"
    summary = ColdStart.of(pods.starts)
    assert summary is not None
    # The median of each phase, not the phases of the median pod.
    assert (summary.total, summary.phases, summary.pods) == (140, (3, 2, 40, 85, None, None, None), 3)
    assert pods.cold_start == 140, "the autoscaler's lead time is still the median of the whole"


def test_a_phase_without_a_time_counts_in_the_next_one() -> None:
    # No container start recorded (a container still waiting on a second image, say): its time goes to Ready.
    (start,) = count_pods([pod("a", 2, 5, None, 100)]).starts
    assert start.phases == (2, 3, None, 95)
    # An Initialized time before PodScheduled is out of order: ignored, not a negative phase.
    (start,) = count_pods([pod("b", 10, 5, 30, 100)]).starts
    assert start.phases == (10, None, 20, 70)


def _decide(pods: list[dict[str, Any]], memory: Memory) -> Any:
    counted = count_pods(pods)
    signals = Signals(latency=0.5, request_rate=1.0, waiting=0.0, running=1.0, kv_cache_usage=0.1)
    seen = Seen(counted.ready, counted, signals)
    return decide(fleet(), seen, memory, T0, interval=INTERVAL, default_cold_start=120)


def test_status_shows_the_medians_and_keeps_them_when_the_pods_are_gone() -> None:
    first = _decide([pod("a", 2, 5, 45, 140)], Memory())
    status = compute_status(fleet(), Observed(deployment=None, scaling=first.scaling()), None, T0)
    assert status.cold_start is not None
    assert status.cold_start.model_dump(by_alias=True, exclude_none=True) == {
        "total": "140s",
        "scheduled": "2s",
        "initialized": "3s",
        "started": "40s",
        "ready": "95s",
        "pods": 1,
    }
    later = _decide([], first.memory)
    assert later.scaling().cold_start == status.cold_start, "the last measurement stays while no pod is Ready"


def test_each_pod_is_observed_once_by_the_operators_histogram() -> None:
    key = ("ml", "qwen")
    labels = {"namespace": "ml", "mmfleet_io_inference": "qwen"}

    def count(phase: str) -> float:
        found = metrics_export.REGISTRY.get_sample_value(
            "mmfleet_fleet_cold_start_phase_seconds_count", {**labels, "phase": phase}
        )
        return found or 0.0

    before = {phase: count(phase) for phase in ("total", *PHASES)}
    memory = Memory()
    try:
        for pods in ([pod("a", 2, 5, 45, 140)], [pod("a", 2, 5, 45, 140), pod("b", 4, 6, None, 150)]):
            outcome = _decide(pods, memory)
            memory = outcome.memory
            seen = Seen(outcome.current, Pods(ready=outcome.current), None)
            metrics_export.record_decision(key, fleet(), seen, outcome, 120)
        assert count("total") - before["total"] == 2, "a and b, once each, whatever the number of cycles"
        assert count("ready") - before["ready"] == 2
        assert count("started") - before["started"] == 1, "b's container start was not recorded"
    finally:
        metrics_export.forget_others(set())


SERVER_LOG = Path(__file__).parents[2] / "data" / "vllm_h200_server_start_0.33.0.log"


def test_vllms_own_log_splits_its_ready_phase_into_weights_engine_and_compile() -> None:
    # The real server's start (Qwen2.5-VL-7B's config on an H200): weights in 3.6 s, then 72.9 s to set up the
    # engine, 22.6 s of it compiling.
    assert vllm.BACKEND.startup(SERVER_LOG.read_text()) == ServerStartup(weights=3.56183, engine=72.91, compile=22.56)
    # Tensor parallel: each worker loads its shard and logs it; the slowest is the phase. An encoder compiled too:
    # the total comes first, its shares after (v1/engine/core.py's three wordings).
    workers = (
        "(Worker_TP0 pid=7) INFO [gpu_model_runner.py:5089] Model loading took 7.9 GiB memory and 4.200000 seconds\n"
        "(Worker_TP1 pid=8) INFO [gpu_model_runner.py:5089] Model loading took 7.9 GiB memory and 5.000000 seconds\n"
        "(EngineCore pid=6) INFO [core.py:396] init engine (profile, create kv cache, warmup model) took 80.00 s "
        "(compilation: 30.00 s — language_model: 20.00 s, encoder: 10.00 s)\n"
    )
    assert vllm.BACKEND.startup(workers) == ServerStartup(weights=5.0, engine=80.0, compile=30.0)
    nothing_compiled = (
        "(EngineCore pid=6) INFO [core.py:413] init engine (profile, create kv cache, warmup model) took 45.68 s\n"
    )
    assert vllm.BACKEND.startup(nothing_compiled) == ServerStartup(engine=45.68)
    assert vllm.BACKEND.startup("") == ServerStartup()
    assert tensorrt_llm.BACKEND.startup(SERVER_LOG.read_text()) == ServerStartup(), "not read for TensorRT-LLM"


def test_status_shows_the_medians_of_what_the_servers_logged_within_ready() -> None:
    pods = [pod("a", 2, 5, 45, 140), pod("b", 4, 6, 65, 150), pod("c", 3, 3, 40, 120)]
    logged = {"a": ServerStartup(3.0, 70.0, 25.0), "b": ServerStartup(5.0, 60.0, 5.0), "c": ServerStartup()}
    counted = with_server(count_pods(pods), logged)
    signals = Signals(latency=0.5, request_rate=1.0, waiting=0.0, running=1.0, kv_cache_usage=0.1)
    outcome = decide(fleet(), Seen(3, counted, signals), Memory(), T0, interval=INTERVAL, default_cold_start=120)
    shown = outcome.scaling().cold_start
    assert shown is not None
    # c's log said nothing: the medians are a's and b's.
    assert (shown.ready, shown.weights, shown.engine, shown.compile) == ("85s", "4s", "65s", "15s")


def _read_cycle(op: Any, record: FleetRecord, pods: list[dict[str, Any]], backend: str = "vllm") -> Pods:
    """One cycle's reads of the server logs, then the Ready pods as the next cycle's decision sees them."""
    body = fleet_body(autoscaling=True)
    body["spec"]["backend"] = {"name": backend}
    view = autoscale.FleetView(KEY, body, None, pods)
    autoscale._read_server_logs(op, record, view, parse(body), count_pods(pods))
    return with_server(count_pods(pods), record.server_logs.read)


def _decided(pods: list[dict[str, Any]]) -> None:
    """One decision for the fleet KEY recorded in the operator's metrics, as its cycle does."""
    outcome = _decide(pods, Memory())
    metrics_export.record_decision(KEY, fleet(), Seen(outcome.current, Pods(ready=outcome.current), None), outcome, 120)


def ready_pods(*names: str) -> list[dict[str, Any]]:
    return [pod(name, 2, 5, 45, 140) for name in names]


def test_each_ready_pods_log_is_read_once_and_a_refused_read_leaves_its_ready_phase_whole() -> None:
    kube = RecordingKube()
    kube.logs = {"a": SERVER_LOG.read_text(), "b": ApiException(status=403, reason="Forbidden")}
    op, record = operator(kube), FleetRecord(uid="u-1")
    labels = {"namespace": KEY[0], "mmfleet_io_inference": KEY[1]}

    def count(phase: str) -> float:
        found = metrics_export.REGISTRY.get_sample_value(
            "mmfleet_fleet_cold_start_phase_seconds_count", {**labels, "phase": phase}
        )
        return found or 0.0

    before = count("weights")
    try:
        _decided(ready_pods("a", "b"))  # the fleet's series exist from its first decision
        _read_cycle(op, record, ready_pods("a", "b"))
        seen = _read_cycle(op, record, ready_pods("a", "b"))
        assert sorted(kube.logs_read) == ["a", "b"], "once per pod, the refused one too: no read every cycle"
        assert {s.pod: s.server for s in seen.starts} == {
            "a": ServerStartup(3.56183, 72.91, 22.56),
            "b": ServerStartup(),
        }
        assert count("weights") - before == 1, "a's start observed once by the operator's histogram"
        _read_cycle(op, record, ready_pods("c"))
        assert set(record.server_logs.read) == {"c"}, "pods gone are forgotten"
    finally:
        metrics_export.forget_others(set())


def test_a_log_read_after_the_fleets_series_ended_does_not_bring_them_back() -> None:
    """Reads finish after the cycle that queued them; the fleet may have been deleted or turned off meanwhile."""
    kube = RecordingKube()
    kube.logs = {"a": SERVER_LOG.read_text()}
    op, record = operator(kube), FleetRecord(uid="u-1")
    labels = {"namespace": KEY[0], "mmfleet_io_inference": KEY[1], "phase": "weights"}
    _decided(ready_pods("a"))
    assert metrics_export.REGISTRY.get_sample_value(
        "mmfleet_fleet_cold_start_phase_seconds_count", labels | {"phase": "total"}
    )
    metrics_export.forget_others(set())
    _read_cycle(op, record, ready_pods("a"))
    assert kube.logs_read == ["a"]
    assert metrics_export.REGISTRY.get_sample_value("mmfleet_fleet_cold_start_phase_seconds_count", labels) is None


def test_a_read_that_may_pass_is_tried_again_a_few_times_and_a_cycle_reads_a_few_logs() -> None:
    kube = RecordingKube()
    kube.logs = {name: RetryableError("504 Gateway Timeout") for name in "abcdef"}
    op, record = operator(kube), FleetRecord(uid="u-1")
    _read_cycle(op, record, ready_pods(*"abcdef"))
    assert kube.logs_read == list("abcd"), "after an operator restart a large fleet's logs come over several cycles"
    for _ in range(autoscale.SERVER_LOG_TRIES * 2):
        _read_cycle(op, record, ready_pods(*"abcdef"))
    assert kube.logs_read.count("a") == autoscale.SERVER_LOG_TRIES, "then left whole: no retry forever"
    assert record.server_logs.read["a"] == ServerStartup()


def test_the_cycle_hands_the_reads_to_their_own_threads_and_never_waits_on_them() -> None:
    """The cycle queues new pods' log reads (after an operator restart at 1,000 fleets, up to 4,000), one batch per
    fleet at a time, and a later cycle sees what they found."""
    started, release = threading.Event(), threading.Event()

    class SlowLogs(RecordingKube):
        def pod_log(self, namespace: str, name: str, container: str, limit_bytes: int) -> str:
            started.set()
            release.wait(5)
            return super().pod_log(namespace, name, container, limit_bytes)

    kube = SlowLogs()
    kube.logs = {"a": SERVER_LOG.read_text()}
    op, record = operator(kube), FleetRecord(uid="u-1")
    op.server_log_pool = ThreadPoolExecutor(2)
    body = fleet_body(autoscaling=True)
    pods = ready_pods("a")
    view = autoscale.FleetView(KEY, body, None, pods)
    try:
        took = time.monotonic()
        for _ in range(2):  # two cycles while the first batch reads: nothing more is queued
            autoscale._read_server_logs_soon(op, record, view, parse(body), count_pods(pods))
        took = time.monotonic() - took
        assert started.wait(5)
        release.set()
        op.server_log_pool.shutdown(wait=True)
    finally:
        release.set()
        metrics_export.forget_others(set())
    assert took < 1, f"the cycle waited {took:.1f} s on a log read"
    assert kube.logs_read == ["a"]
    assert record.server_logs.read["a"] == ServerStartup(3.56183, 72.91, 22.56)
    autoscale._read_server_logs_soon(op, record, view, parse(body), count_pods(pods))
    assert kube.logs_read == ["a"], "nothing left to read: nothing queued"


def test_tensorrt_llms_log_is_not_fetched() -> None:
    kube = RecordingKube()
    record = FleetRecord(uid="u-1")
    _read_cycle(operator(kube), record, ready_pods("a"), backend="tensorrt-llm")
    assert kube.logs_read == []


def test_only_vllms_own_lines_before_it_serves_are_read() -> None:
    # uvicorn's own lines left out (--uvicorn-log-level warning): vLLM's "Starting vLLM server on" still ends the start.
    start = "".join(line for line in SERVER_LOG.read_text().splitlines(True) if not line.startswith("INFO:"))
    assert vllm.BACKEND.startup(start) == ServerStartup(3.56183, 72.91, 22.56)
    # A client's prompt, logged later (--enable-log-requests), that quotes the line: not a measurement.
    prompt = "Received request chatcmpl-1: prompt: '[core.py:405] init engine (profile, create kv cache, warmup model)"
    later = start + prompt + " took 9999.00 s'\n"
    assert vllm.BACKEND.startup(later) == vllm.BACKEND.startup(start)
    quoted = "INFO: user said: init engine (profile, create kv cache, warmup model) took 1.00 s\n"
    assert vllm.BACKEND.startup(quoted) == ServerStartup(), "not vLLM's logger's line"
