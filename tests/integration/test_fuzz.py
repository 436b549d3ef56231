"""Generated hostile specs through kube-apiserver 1.34 and the operator: what the API server accepts, the operator
serves or refuses naming the field; what it refuses, it refuses naming the field; nothing crashes or hangs.

Specs come from two reproducible sources (seeded; ``MMFLEET_FUZZ_SEED`` and ``MMFLEET_FUZZ_COUNT`` change them):
property-based from the CRD's schema, which is generated from the pydantic models (hypothesis, derandomized: within
bounds mostly, with a hostile value now and then: wrong types, out-of-bound, huge and negative numbers, unicode, long
and flag-like strings, unknown fields), and mutations of ``examples/*.yaml`` (the same hostile values at random
paths, long and non-DNS names, deep nesting). Each is created with ``dryRun=All`` and strict field validation, as
``kubectl apply --dry-run=server`` sends it; an accepted one is parsed as the operator reads it back (defaulted,
pruned) and rendered for its cloud, and every child, and the inference pod as a Pod in a namespace enforcing Pod
Security "restricted", is created with ``dryRun=All`` too. YAML-level attacks (alias bombs, deep nesting, huge
integers) go through the real ``kubectl`` and the operator's own reader. The counts are printed and, with
``MMFLEET_FUZZ_REPORT=path``, written as JSON: ``docs/reliability.md`` quotes them.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from mmfleet import crd as crd_module
from mmfleet import render
from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet.cli import load_documents
from mmfleet.render import SpecError
from mmfleet.validation import parse
from mmfleet_lab.cluster import Cluster, ensure_binaries
from tests.conftest import ROOT
from tests.integration import test_helm, test_least_privilege

pytestmark = pytest.mark.integration

# The Prometheus Operator's released PodMonitor CRD, served while this module runs (test_helm's fixture), so that the
# operator renders PodMonitors as it would with the CRD installed and the API server validates them too.
pod_monitor_crd = test_helm.pod_monitor_crd
settled_pod_monitor_crd = test_least_privilege.settled_pod_monitor_crd

SEED = int(os.environ.get("MMFLEET_FUZZ_SEED", "13"))
COUNT = int(os.environ.get("MMFLEET_FUZZ_COUNT", "1200"))  # half from the schema, half mutations of the examples
HANG = 5.0  # seconds: parsing and rendering one spec takes milliseconds; an API call, tens of them
# A problem line of the operator's: a field path rooted at the document, then what is wrong (tests/unit/test_properties)
PROBLEM = re.compile(r"^(spec|metadata|kind|apiVersion)(\.[A-Za-z0-9_-]+|\[\d+\])*: .+")

GOOD_STRINGS = [
    "a", "m", "gpu", "ml", "default", "node-1", "hf-token", "1", "a.b.c", "A_b-c.D", "metadata.name",
    "Qwen/Qwen2.5-VL-7B-Instruct", "meta-llama/Llama-3.2-11B-Vision-Instruct", "hf://Qwen/Qwen2.5-VL-7B-Instruct",
    "s3://bucket/models/m", "oss://b/m", "pvc://cache/models", "2s", "500ms", "1m30s", "0s", "0.0001ms", "99999h",
    "kubernetes.io/hostname", "topology.kubernetes.io/zone", "example.com/gpu-class", "nvidia.com/gpu",
    "vllm/vllm-openai:v0.33.0", "http://otel-collector.observability.svc:4317", "https://x.example.com:4318",
    "--trust-remote-code", "--max-loras=2",
]  # fmt: skip
HOSTILE_STRINGS = [
    "", " ", "-", "-x", "--api-key=sk-fuzz-secret", "--disable-log-stats", "é", "模型", "🙂", "a" * 64, "a" * 254,
    "a" * 2049, "a/b/c/d", "UPPER", "a b", "a\nb", "${HOME}", "$(id)", "'; DROP TABLE x", "\u0000", "..", "a..b",
    "-a", "a-", "http://", "hf://-flag", "pvc://", "1e309", "0", "-1s", "1.5.5s", "999999999999h", ".", "a:b", "a=b",
]  # fmt: skip
HOSTILE_VALUES: list[Any] = [
    None, True, -1, 0, 2**31, 2**63, 2**64, 10**30, -(10**30), 1.5, -0.0, 1e308, "1", "true", [], {}, [1, "a"],
    {"a": {"b": {"c": 1}}}, *HOSTILE_STRINGS,
]  # fmt: skip
NAMES = ["fz", "a" * 63, "a" * 64, "a" * 253, "a.b", "x-1", "9start", "UPPER", "é", "a--b", "-a", "a_b", ""]


def _schema() -> dict[str, Any]:
    body = yaml.safe_load(crd_module.crd_yaml())
    schema: dict[str, Any] = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def _strings(node: dict[str, Any]) -> list[str]:
    pattern = node.get("pattern")
    low, high = node.get("minLength", 0), node.get("maxLength", 10**9)
    fits = [
        s
        for s in GOOD_STRINGS + HOSTILE_STRINGS
        if (pattern is None or re.search(pattern, s)) and low <= len(s) <= high
    ]
    return fits or GOOD_STRINGS


def _valid(node: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
    """Mostly within the schema's bounds (its enums, ranges and patterns), so that many specs get past the CRD."""
    kind = node.get("type")
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if "const" in node:
        return st.just(node["const"])
    if kind == "integer":
        low, high = node.get("minimum", -(2**63)), node.get("maximum", 2**63 - 1)
        return st.one_of(st.sampled_from([low, high]), st.integers(low, high))
    if kind == "number":
        low, high = node.get("minimum", -1e9), node.get("maximum", 1e9)
        return st.floats(
            low, high, allow_nan=False, allow_infinity=False, exclude_min=node.get("exclusiveMinimum", False)
        )
    if kind == "string":
        return st.sampled_from(_strings(node))
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(_value(node["items"], depth + 1), max_size=min(node.get("maxItems", 3), 3))
    if kind == "object" and "properties" in node:
        properties = node["properties"]
        required = set(node.get("required", []))
        return st.fixed_dictionaries(
            {k: _value(v, depth + 1) for k, v in properties.items() if k in required},
            optional={k: _value(v, depth + 1) for k, v in properties.items() if k not in required},
        )
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        keys = st.sampled_from(["a", "example.com/tier", "kubernetes.io/hostname", "team", "é", "-bad", "a" * 70])
        return st.dictionaries(keys, _value(node["additionalProperties"], depth + 1), max_size=3)
    return st.sampled_from(HOSTILE_VALUES)


def _value(node: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """One field: one time in 64 a hostile value (any type), else a valid-looking one; one object in 32 gains an
    unknown field. Rarely enough that a third of the specs get past the CRD, to the operator."""
    if depth > 12:
        return st.sampled_from(HOSTILE_VALUES)
    valid = st.deferred(lambda: _valid(node, depth))
    if node.get("type") == "object" and "properties" in node:
        plain = valid
        valid = st.integers(0, 31).flatmap(
            lambda roll: plain.map(lambda d: {**d, "fuzzUnknown": 1}) if roll == 0 else plain
        )
    return st.integers(0, 63).flatmap(lambda roll: st.sampled_from(HOSTILE_VALUES) if roll == 0 else valid)


def schema_specs(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` specs drawn by hypothesis from the CRD schema, the same for the same seed."""
    found: list[dict[str, Any]] = []
    strategy = _value(_schema())

    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @hypothesis.seed(seed)
    @given(strategy)
    def collect(spec: Any) -> None:
        found.append(spec)

    collect()
    return found[:count]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if len(prefix) > 12:  # the inside of a value an earlier mutation nested deep
        return
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield (*prefix, index)
            yield from _paths(value, (*prefix, index))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        doc = doc[step]
    doc[path[-1]] = value


def _nested(depth: int) -> dict[str, Any]:
    deep: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        deep = {"n": deep}
    return deep


def example_mutations(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` examples, each with one to three of: a hostile value at a random path, a field dropped, an unknown
    field, a deeply nested value, a hostile name."""
    rng = random.Random(seed)
    examples = [d for p in sorted((ROOT / "examples").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    out = []
    for _ in range(count):
        doc = copy.deepcopy(rng.choice(examples))
        for _ in range(rng.randint(1, 3)):
            paths = [p for p in _paths(doc["spec"], ("spec",))]
            move = rng.randrange(5)
            if move == 0 and paths:
                _set(doc, rng.choice(paths), rng.choice(HOSTILE_VALUES))
            elif move == 1 and paths:
                path = rng.choice(paths)
                parent = doc
                for step in path[:-1]:
                    parent = parent[step]
                del parent[path[-1]]
            elif move == 2:
                target = rng.choice([p for p in paths if isinstance(_get(doc, p), dict)] or [("spec",)])
                _get(doc, target)["fuzzUnknown" + str(rng.randrange(9))] = rng.choice(HOSTILE_VALUES)
            elif move == 3 and paths:
                _set(doc, rng.choice(paths), _nested(rng.choice([10, 100, 250])))  # deeper: the YAML attacks
            else:
                doc["metadata"]["name"] = rng.choice(NAMES)
        out.append(doc)
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


@dataclass
class Tally:
    """What happened to each spec; ``failures`` holds a sample of each kind of failure, with the spec."""

    counts: Counter[str] = field(default_factory=Counter)
    failures: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    yaml: dict[str, str] = field(default_factory=dict)  # how kubectl refused each YAML attack

    def fail(self, kind: str, spec: Any, why: str) -> None:
        self.counts[kind] += 1
        self.failures.setdefault(kind, [])
        if len(self.failures[kind]) < 5:
            self.failures[kind].append({"why": why[:1500], "spec": spec})


FIELD_PATH = re.compile(r"\b(spec|metadata)(\.[A-Za-z0-9_-]+|\[\d+\])*\b")


def _refusal_names_fields(error: ApiException) -> bool:
    """The API server's Status for a refusal: each cause carries its field path (kubectl prints it before the
    message); a refusal without causes (strict decoding: an unknown field) names the path in its message."""
    try:
        status = json.loads(error.body)
    except (TypeError, ValueError):
        return False
    causes = (status.get("details") or {}).get("causes") or []
    if causes:
        return all(c.get("field") for c in causes)
    return bool(FIELD_PATH.search(status.get("message", "")))


class Checker:
    def __init__(self, api: Any, namespace: str, tally: Tally) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.dyn = dynamic.DynamicClient(api)
        self.discovery = threading.Lock()
        self.namespace = namespace
        self.tally = tally

    def check(self, number: int, spec_doc: dict[str, Any]) -> None:
        body = {**spec_doc, "metadata": {"name": f"fz-{number}", **spec_doc["metadata"], "namespace": self.namespace}}
        counts = self.tally.counts
        counts["specs"] += 1
        try:
            served = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, body, dry_run="All", field_validation="Strict",
                _request_timeout=30,
            )  # fmt: skip
        except ApiException as error:
            counts["refused by the API server"] += 1
            if not _refusal_names_fields(error):
                self.tally.fail("API server refusals not naming a field", body, str(error.body))
            return
        except Exception as error:  # a timeout or a broken connection: a hang
            self.tally.fail("hangs", body, repr(error))
            return
        counts["accepted by the API server"] += 1
        started = time.monotonic()
        try:
            inference = parse(served)
            cloud = inference.spec.cloud
            children = render.render(inference, "generic" if cloud == "auto" else cloud, monitoring_crds=True)
        except SpecError as error:
            counts["accepted, refused by the operator"] += 1
            if not all(PROBLEM.match(line) for line in error.problems):
                self.tally.fail("operator refusals not naming a field", served, "\n".join(error.problems))
            return
        except Exception as error:  # the count of exactly this must be 0
            self.tally.fail("crashes", served, repr(error))
            return
        finally:
            if time.monotonic() - started > HANG:
                self.tally.fail("hangs", served, f"parse and render took {time.monotonic() - started:.1f}s")
        counts["accepted, rendered"] += 1
        refused = self._dry_run_children(children)
        if refused:
            self.tally.fail("accepted specs whose children the API server refuses", served, refused)
        else:
            counts["accepted, every child accepted"] += 1

    def _dry_run_children(self, children: list[dict[str, Any]]) -> str:
        deployment = next(c for c in children if c["kind"] == "Deployment")
        template = deployment["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": deployment["metadata"]["name"], "labels": template["metadata"].get("labels", {})},
            "spec": template["spec"],
        }
        for child in [*children, pod]:
            if child["kind"] == "ServiceAccount":  # created for real (a Pod names an existing one), without an owner
                self._ensure(child)
                continue
            with self.discovery:  # the dynamic client's discovery cache is not thread-safe
                resource = self.dyn.resources.get(api_version=child["apiVersion"], kind=child["kind"])
            try:
                resource.create(body=child, namespace=self.namespace, dry_run="All", _request_timeout=30)
            except ApiException as error:
                return f"{child['kind']} {child['metadata']['name']}: {error.body}"
        return ""

    def _ensure(self, account: dict[str, Any]) -> None:
        meta = {k: v for k, v in account["metadata"].items() if k != "ownerReferences"}
        try:
            client.CoreV1Api(self.custom.api_client).create_namespaced_service_account(
                self.namespace, {**account, "metadata": meta}
            )
        except ApiException as error:
            if error.status != 409:
                raise


YAML_ATTACKS = {
    "alias bomb in a free field": "l0: &l0 [a,a,a,a,a,a,a,a,a]\n"
    + "".join(f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9)),
    "deep flow nesting": "spec: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep block nesting": "spec:\n" + "".join("  " * i + "a:\n" for i in range(1, 400)) + "  " * 400 + "b: 1\n",
    "huge integer": "spec:\n  model: {name: m}\n  replicas: " + "9" * 5000 + "\n",
    "alias cycle": "spec: &s\n  model: *s\n",
}
HEADER = "apiVersion: mmfleet.io/v1alpha1\nkind: MultimodalInference\nmetadata: {name: fz-yaml}\n"


@pytest.fixture
def fuzz_namespace(api: Any, namespace: str) -> str:
    client.CoreV1Api(api).patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    return namespace


def test_generated_specs_are_served_or_refused_naming_the_field(
    cluster: Cluster, api: Any, crd: None, pod_monitor_crd: None, fuzz_namespace: str, tmp_path: Path
) -> None:
    tally = Tally()
    specs = [
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MultimodalInference", "metadata": {}, "spec": spec}
        for spec in schema_specs(COUNT // 2, SEED)
    ]
    specs += example_mutations(COUNT - len(specs), SEED)
    checker = Checker(api, fuzz_namespace, tally)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda item: checker.check(*item), enumerate(specs)))
    kubectl = ensure_binaries().kubectl
    for name, text in YAML_ATTACKS.items():
        path = tmp_path / f"{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(HEADER + text)
        tally.counts["specs"] += 1
        argv = [str(kubectl), "--kubeconfig", str(cluster.kubeconfig), "apply", "--dry-run=server", "-f", str(path)]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except subprocess.TimeoutExpired:
            tally.fail("hangs", name, "kubectl apply did not return in 60 s")
            continue
        if result.returncode == 0:
            tally.fail("YAML attacks kubectl accepted", name, result.stdout)
        else:
            tally.counts["refused by the API server"] += 1
            tally.yaml[name] = result.stderr.strip()[:300]
        try:
            load_documents(path.read_bytes(), str(path))
        except SpecError:
            tally.counts["YAML attacks the operator refuses"] += 1
        except Exception as error:
            tally.fail("crashes", name, repr(error))
        else:
            tally.fail("YAML attacks the operator reads", name, "")
    tally.counts["seconds"] = round(time.monotonic() - started)
    report = {"seed": SEED, "counts": dict(tally.counts), "failures": tally.failures, "kubectl": tally.yaml}
    print(json.dumps(report["counts"], indent=1))
    if os.environ.get("MMFLEET_FUZZ_REPORT"):
        Path(os.environ["MMFLEET_FUZZ_REPORT"]).write_text(json.dumps(report, indent=1, default=str))
    bad = {kind: tally.failures[kind] for kind in tally.failures}
    assert tally.counts["specs"] >= 1000
    assert tally.counts["accepted, every child accepted"] >= 100, "too few specs got past the CRD to test the operator"
    assert bad == {}, json.dumps(bad, indent=1, default=str)[:20000]
