"""Generated hostile specs through kube-apiserver and the running operator (``mmfleet bench fuzz``, issue 13).

Specs come from two reproducible sources (seeded): property-based from the CRD's schema, which is generated from the
pydantic models (hypothesis, derandomized: within bounds mostly, with a hostile value now and then: wrong types,
out-of-bound, huge and negative numbers, unicode, long and flag-like strings, unknown fields; lists and maps now and
then at their maxItems or maxProperties or one over, strings at their maxLength or one over), and mutations of
``examples/*.yaml`` (the same hostile values at random paths, long and non-DNS names, deep nesting); plus YAML-level
attacks (alias bombs, deep nesting, huge integers).

Two legs. The dry run (``Checker``): each spec is created with ``dryRun=All`` and strict field validation, as
``kubectl apply --dry-run=server`` sends it; an accepted one is parsed as the operator reads it back (defaulted,
pruned) and rendered for its cloud, and every child, and the inference pod as a Pod in a namespace enforcing Pod
Security "restricted", is created with ``dryRun=All`` too. The live leg (``live``): every accepted spec is created for
real, in batches, each in a namespace of its own enforcing "restricted" (with a ResourceQuota of ``QUOTA_PODS`` pods,
so a fleet of 1,000 replicas costs two pods), while ``mmfleet run`` serves the cluster as its own process; within
``BOUND`` seconds the operator must write a status for the fleet's generation and either serve it (its Deployment
made, the pods the quota allows created, no ReplicaSet ``FailedCreate`` but the quota's) or refuse it with
``InvalidSpec`` naming the field. Generation 2, as ``kubectl apply`` of a changed file makes it: every
``UPDATE_EVERY``-th fleet gets its spec replaced by another accepted one once the operator answered it, the next one
right after its creation (racing the first reconcile), and ``UPDATE_SHAPES`` plant the transitions users make (valid
to invalid and back, autoscaling on and off, vLLM to TensorRT-LLM, one the API server refuses); within ``BOUND`` the
same verdicts, for the new generation, with the Deployment's containers and replicas as ``mmfleet render`` gives them
for the new spec. The fleets are deleted after each batch and must be gone, children included.
"""

from __future__ import annotations

import copy
import json
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmfleet import crd as crd_module
from mmfleet import render
from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet.cli import load_documents
from mmfleet.clouds import COLLECTOR_ENDPOINT
from mmfleet.render import COMPONENT, INFERENCE_LABEL, SpecError
from mmfleet.validation import parse
from mmfleet_lab.cluster import process
from mmfleet_lab.cluster.crds import install_crd
from mmfleet_lab.cluster.discovery import dynamic_client
from mmfleet_lab.cluster.kubectl import run_kubectl

Progress = Callable[[str], None]

HANG = 5.0  # seconds: parsing and rendering one spec takes milliseconds; an API call, tens of them
SERVERS = f"{INFERENCE_LABEL},app.kubernetes.io/component={COMPONENT}"  # a fleet's model servers, not its picker
BOUND = 60.0  # seconds from a fleet's creation to its status (served or refused), and from its deletion to gone
BATCH = 40  # fleets live at once: what 2 cores serve within BOUND, each with its namespace, children and pods
QUOTA_PODS = 2  # pods per fleet's namespace: enough to see the pods admitted, few enough for 1,000-replica specs
RETRY_LIMIT = 5  # the same warning for one fleet more often than this within a batch is a retry loop
UPDATE_EVERY = 3  # every third live fleet is updated once answered: a second round of the batch, a third longer
# A problem line of the operator's: a field path rooted at the document, then what is wrong
# (tests/unit/operator/test_properties.py)
PROBLEM = re.compile(r"^(spec|metadata|kind|apiVersion)(\.[A-Za-z0-9_-]+|\[\d+\])*: .+")
FIELD_PATH = re.compile(r"\b(spec|metadata)(\.[A-Za-z0-9_-]+|\[\d+\])*\b")
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
RUN_LABEL = "fuzz.mmfleet.io/run"
TRACEBACK = "Traceback (most recent call last)"

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


# The longest label key Kubernetes accepts: a 253-character DNS-subdomain prefix, '/', a 63-character name.
LONGEST_LABEL_KEY = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]) + "/" + "k" * 63


def _strings(node: dict[str, Any]) -> list[str]:
    """The candidates that fit the field, among them one at its maxLength."""
    pattern = node.get("pattern")
    low, high = node.get("minLength", 0), node.get("maxLength", 10**9)
    longest = ["a" * high, "--" + "a" * (high - 2), LONGEST_LABEL_KEY] if high < 10**9 else []
    fits = [
        s
        for s in GOOD_STRINGS + HOSTILE_STRINGS + longest
        if (pattern is None or re.search(pattern, s)) and low <= len(s) <= high
    ]
    return fits or GOOD_STRINGS


def _size(bound: int) -> st.SearchStrategy[int]:
    """How many items: mostly up to 3, one time in 16 the bound, one in 16 one more than the bound."""
    return st.integers(0, 15).flatmap(
        lambda roll: st.just(bound) if roll == 0 else st.just(bound + 1) if roll == 1 else st.integers(0, min(bound, 3))
    )


def _long(node: dict[str, Any], valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A string field's value: one time in 64 one character over its maxLength."""
    high = node.get("maxLength")
    if high is None:
        return valid
    return st.integers(0, 63).flatmap(lambda roll: st.just("a" * (high + 1)) if roll == 0 else valid)


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
        return _long(node, st.sampled_from(_strings(node)))
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        # A long list repeats one drawn item: hypothesis draws a few KiB per example, not a full list of full items.
        item = _value(node["items"], depth + 1)
        return _size(node.get("maxItems", 3)).flatmap(
            lambda n: st.lists(item, max_size=n, min_size=n) if n <= 3 else item.map(lambda one: [one] * n)
        )
    if kind == "object" and "properties" in node:
        properties = node["properties"]
        required = set(node.get("required", []))
        return st.fixed_dictionaries(
            {k: _value(v, depth + 1) for k, v in properties.items() if k in required},
            optional={k: _value(v, depth + 1) for k, v in properties.items() if k not in required},
        )
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        names = ["a", "example.com/tier", "kubernetes.io/hostname", "team", "é", "-bad", "a" * 70, LONGEST_LABEL_KEY]
        value = _value(node["additionalProperties"], depth + 1)
        few = st.dictionaries(st.sampled_from(names), value, max_size=3)
        # Many keys: distinct, some of the longest a key may be, one value for all.
        many = st.tuples(_size(node.get("maxProperties", 3)), st.sampled_from(names), value).map(
            lambda drawn: {f"{drawn[1][:-3]}{i:03d}": drawn[2] for i in range(drawn[0])}
        )
        return st.one_of(few, many)
    return st.sampled_from(HOSTILE_VALUES)


def _value(node: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """One field: one time in 64 a hostile value (any type), else a valid-looking one; one object in 32 gains an
    unknown field. Rarely enough that a fifth of the specs get past the CRD, to the operator."""
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


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    _get(doc, path[:-1])[path[-1]] = value


def _nested(depth: int) -> dict[str, Any]:
    deep: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        deep = {"n": deep}
    return deep


# The fuzz explores what the operator renders and serves, so its operator lets a fleet name anything; the policy's
# refusals have tests of their own (tests/unit/operator/test_admin_policy.py, test_least_privilege).
OPEN_POLICY = json.dumps({
    "images": ["*"], "secrets": ["*/*"], "claims": ["*/*"], "identities": ["*/*"], "tolerationKeys": ["*"],
    "nodeLabelKeys": ["*"], "gatewayNamespaces": ["*"], "warmStandbyNamespaces": ["*"],
    "loadBalancer": {"allowed": True},
})  # fmt: skip


def examples_dir() -> Path:
    """``examples/`` of the source tree this module runs from (the lab runs from a checkout)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "examples" / "minimal.yaml").exists():
            return parent / "examples"
    raise FileNotFoundError("examples/ not found next to the mmfleet source tree")


def example_mutations(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` examples, each with one to three of: a hostile value at a random path, a field dropped, an unknown
    field, a deeply nested value, a hostile name."""
    rng = random.Random(seed)
    paths = sorted(examples_dir().glob("*.yaml"))
    examples = [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]
    out = []
    for _ in range(count):
        doc = copy.deepcopy(rng.choice(examples))
        for _ in range(rng.randint(1, 3)):
            found = list(_paths(doc["spec"], ("spec",)))
            move = rng.randrange(5)
            if move == 0 and found:
                _set(doc, rng.choice(found), rng.choice(HOSTILE_VALUES))
            elif move == 1 and found:
                path = rng.choice(found)
                del _get(doc, path[:-1])[path[-1]]
            elif move == 2:
                target = rng.choice([p for p in found if isinstance(_get(doc, p), dict)] or [("spec",)])
                _get(doc, target)["fuzzUnknown" + str(rng.randrange(9))] = rng.choice(HOSTILE_VALUES)
            elif move == 3 and found:
                _set(doc, rng.choice(found), _nested(rng.choice([10, 100, 250])))  # deeper: the YAML attacks
            else:
                doc["metadata"]["name"] = rng.choice(NAMES)
        out.append(doc)
    return out


def generated(count: int, seed: int) -> list[dict[str, Any]]:
    """The run's documents: half drawn from the schema, half mutated examples."""
    specs = [
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MultimodalInference", "metadata": {}, "spec": spec}
        for spec in schema_specs(count // 2, seed)
    ]
    return specs + example_mutations(count - len(specs), seed)


def _fleet(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MultimodalInference", "metadata": {"name": name}, "spec": spec}


_MODEL: dict[str, Any] = {"model": {"name": "Qwen/Qwen2.5-VL-3B-Instruct"}}
_SCALER: dict[str, Any] = {"minReplicas": 1, "maxReplicas": 2, "slo": {"target": "2s"}}
_AUTOSCALED = {**_MODEL, "autoscaling": _SCALER}
# The API server accepts it (a CEL rule on map keys would exceed its cost budget); the operator refuses it, naming the
# field: the live leg must see InvalidSpec for it, whatever the seed drew.
REFUSED_BY_THE_OPERATOR = _fleet("planted", {**_MODEL, "placement": {"nodeSelector": {"-bad key": "x"}}})
SERVED, REFUSED, API_REFUSED = "served", "refused naming the field", "refused by the API server"
ANSWERED = (SERVED, REFUSED)


@dataclass(frozen=True)
class Plan:
    """One live fleet: created from ``body``; once answered, or ``racing`` right after its creation, its spec replaced
    by ``update``'s (generation 2). A planted shape names the verdicts it must get, for its creation and its update."""

    body: dict[str, Any]
    update: dict[str, Any] | None = None
    shape: str = ""
    expect: tuple[str, str] = ("", "")
    racing: bool = False


UPDATE_SHAPES = [
    Plan(_fleet("to-invalid", _MODEL), REFUSED_BY_THE_OPERATOR, "valid -> invalid", (SERVED, REFUSED)),
    Plan(
        _fleet("to-bad", _MODEL),
        _fleet("to-bad", {**_MODEL, "replicas": -1}),
        "valid -> refused",
        (SERVED, API_REFUSED),
    ),
    Plan(REFUSED_BY_THE_OPERATOR, _fleet("planted", _MODEL), "invalid -> valid", (REFUSED, SERVED)),
    # minReplicas 2: a Deployment left at generation 1's one replica is then outside the bounds, so the check can fail
    Plan(
        _fleet("scale-on", _MODEL),
        _fleet("scale-on", {**_MODEL, "autoscaling": {**_SCALER, "minReplicas": 2, "maxReplicas": 3}}),
        "autoscaling off -> on",
        (SERVED, SERVED),
    ),
    Plan(
        _fleet("scale-off", _AUTOSCALED),
        _fleet("scale-off", {**_MODEL, "autoscaling": {**_SCALER, "enabled": False}, "replicas": 2}),
        "autoscaling on -> off",
        (SERVED, SERVED),
    ),
    Plan(
        _fleet("trtllm", {**_MODEL, "backend": {"name": "vllm"}}),
        _fleet("trtllm", {**_MODEL, "backend": {"name": "tensorrt-llm"}}),
        "vllm -> tensorrt-llm",
        (SERVED, SERVED),
    ),
]


def plans(bodies: list[dict[str, Any]], seed: int, every: int = UPDATE_EVERY) -> list[Plan]:
    """The live leg's fleets: each accepted body; every ``every``-th one updated once answered to another accepted
    body (drawn with ``seed``), the one after it updated so right after its creation (``kubectl apply`` twice in a
    row, racing the operator's first reconcile); then ``UPDATE_SHAPES``."""
    rng = random.Random(seed)
    out = []
    for index, body in enumerate(bodies):
        others = [b for b in bodies if b["spec"] != body["spec"]] if index % every in (0, 1) else []
        out.append(Plan(body, rng.choice(others), racing=index % every == 1) if others else Plan(body))
    return [*out, *UPDATE_SHAPES]


@dataclass
class Tally:
    """What happened to each spec; ``failures`` holds a sample of each kind of failure, with the spec."""

    counts: Counter[str] = field(default_factory=Counter)
    failures: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    yaml: dict[str, str] = field(default_factory=dict)  # how kubectl refused each YAML attack
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] += 1

    def fail(self, kind: str, spec: Any, why: str) -> None:
        with self.lock:
            self.counts[kind] += 1
            self.failures.setdefault(kind, [])
            if len(self.failures[kind]) < 5:
                self.failures[kind].append({"why": why[:1500], "spec": spec})


def refusal_names_fields(body: str) -> bool:
    """The API server's Status for a refusal: each cause carries its field path (kubectl prints it before the
    message); a refusal without causes (strict decoding: an unknown field) names the path in its message."""
    try:
        status = json.loads(body)
    except (TypeError, ValueError):
        return False
    causes = (status.get("details") or {}).get("causes") or []
    if causes:
        return all(c.get("field") for c in causes)
    return bool(FIELD_PATH.search(status.get("message", "")))


class Checker:
    """The dry-run leg for one spec at a time (thread-safe)."""

    def __init__(self, api: Any, namespace: str, tally: Tally) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api)
        self.dyn = dynamic_client(api)
        self.discovery = threading.Lock()
        self.namespace = namespace
        self.tally = tally

    def check(self, number: int, spec_doc: dict[str, Any]) -> dict[str, Any] | None:
        """The body as sent when the API server accepted it (for the live leg), else None."""
        from kubernetes.client.exceptions import ApiException

        body = {**spec_doc, "metadata": {"name": f"fz-{number}", **spec_doc["metadata"], "namespace": self.namespace}}
        self.tally.add("specs")
        try:
            served = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, body, dry_run="All", field_validation="Strict",
                _request_timeout=30,
            )  # fmt: skip
        except ApiException as error:
            self.tally.add("refused by the API server")
            if not refusal_names_fields(error.body):
                self.tally.fail("API server refusals not naming a field", body, str(error.body))
            return None
        except Exception as error:  # a timeout or a broken connection: a hang
            self.tally.fail("hangs", body, repr(error))
            return None
        self.tally.add("accepted by the API server")
        started = time.monotonic()
        try:
            inference = parse(served)
            cloud = inference.spec.cloud
            children = render.render(inference, "generic" if cloud == "auto" else cloud, monitoring_crds=True)
        except SpecError as error:
            self.tally.add("accepted, refused by the operator")
            if not all(PROBLEM.match(line) for line in error.problems):
                self.tally.fail("operator refusals not naming a field", served, "\n".join(error.problems))
            return body
        except Exception as error:  # the count of exactly this must be 0
            self.tally.fail("crashes", served, repr(error))
            return body
        finally:
            if time.monotonic() - started > HANG:
                self.tally.fail("hangs", served, f"parse and render took {time.monotonic() - started:.1f}s")
        self.tally.add("accepted, rendered")
        refused = self._dry_run_children(children)
        if refused:
            self.tally.fail("accepted specs whose children the API server refuses", served, refused)
        else:
            self.tally.add("accepted, every child accepted")
        return body

    def _dry_run_children(self, children: list[dict[str, Any]]) -> str:
        from kubernetes.client.exceptions import ApiException

        pods = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": child["metadata"]["name"],
                    "labels": child["spec"]["template"]["metadata"]["labels"],
                },
                "spec": child["spec"]["template"]["spec"],
            }
            for child in children
            if child["kind"] == "Deployment"  # the inference pods, and the endpoint picker's in routing inferencePool
        ]
        for child in [*children, *pods]:
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
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        meta = {k: v for k, v in account["metadata"].items() if k != "ownerReferences"}
        try:
            client.CoreV1Api(self.custom.api_client).create_namespaced_service_account(
                self.namespace, {**account, "metadata": meta}
            )
        except ApiException as error:
            if error.status != 409:
                raise


def dry_run(api: Any, namespace: str, specs: list[dict[str, Any]], tally: Tally) -> list[dict[str, Any]]:
    """The dry-run leg over ``specs`` in ``namespace`` (enforcing "restricted"); the accepted bodies, in order."""
    checker = Checker(api, namespace, tally)
    with ThreadPoolExecutor(max_workers=4) as pool:
        bodies = list(pool.map(lambda item: checker.check(*item), enumerate(specs)))
    return [b for b in bodies if b is not None]


YAML_ATTACKS = {
    "alias bomb in a free field": "l0: &l0 [a,a,a,a,a,a,a,a,a]\n"
    + "".join(f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9)),
    "deep flow nesting": "spec: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep block nesting": "spec:\n" + "".join("  " * i + "a:\n" for i in range(1, 400)) + "  " * 400 + "b: 1\n",
    "huge integer": "spec:\n  model: {name: m}\n  replicas: " + "9" * 5000 + "\n",
    "alias cycle": "spec: &s\n  model: *s\n",
}
YAML_HEADER = "apiVersion: mmfleet.io/v1alpha1\nkind: MultimodalInference\nmetadata: {name: fz-yaml}\n"


def yaml_attacks(kubeconfig: Path, folder: Path, tally: Tally) -> None:
    """Each YAML attack through the real ``kubectl apply --dry-run=server`` and the operator's own reader."""
    for name, text in YAML_ATTACKS.items():
        path = folder / f"fuzz-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(YAML_HEADER + text)
        tally.add("specs")
        try:
            result = run_kubectl(kubeconfig, "apply", "--dry-run=server", "-f", str(path), timeout=60)
        except subprocess.TimeoutExpired:
            tally.fail("hangs", name, "kubectl apply did not return in 60 s")
            continue
        if result.returncode == 0:
            tally.fail("YAML attacks kubectl accepted", name, result.stdout)
        else:
            tally.add("refused by the API server")
            tally.yaml[name] = result.stderr.strip()[:300]
        try:
            load_documents(path.read_bytes(), str(path))
        except SpecError:
            tally.add("YAML attacks the operator refuses")
        except Exception as error:
            tally.fail("crashes", name, repr(error))
        else:
            tally.fail("YAML attacks the operator reads", name, "")
        path.unlink()


@dataclass(frozen=True)
class Running:
    """The operator process the live leg watches: whether it exited, its log, its /healthz."""

    exited: Callable[[], int | None]
    log: Path
    healthz: str  # URL


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _condition(fleet: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (fleet.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


@dataclass
class _Live:
    """One fleet of the live leg: where it runs and what was seen of it; ``leg`` is "update" from generation 2 on."""

    namespace: str
    plan: Plan
    body: dict[str, Any] = field(init=False)
    created: float = 0.0
    verdict: str = ""  # empty until judged
    leg: str = "live"

    def __post_init__(self) -> None:
        self.body = self.plan.body

    def sample(self) -> dict[str, Any]:
        """What a failure's sample shows: the spec, or the update and the spec it replaced."""
        if self.leg == "live":
            return self.body
        return {"shape": self.plan.shape, "updated from": self.plan.body, "to": self.body}


class _Cluster:
    """The cluster-wide lists one poll of the live leg reads (a handful of requests for a whole batch)."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.net = client.NetworkingV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.api = api

    def _by_namespace(self, items: list[Any]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for item in items:
            obj = item if isinstance(item, dict) else self.api.sanitize_for_serialization(item)
            out.setdefault(obj["metadata"]["namespace"], []).append(obj)
        return out

    def fleets(self) -> dict[str, list[dict[str, Any]]]:
        return self._by_namespace(
            self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=30)["items"]
        )

    def deployments(self) -> dict[str, list[dict[str, Any]]]:
        """The inference Deployments (not the endpoint picker's)."""
        found = self.apps.list_deployment_for_all_namespaces(label_selector=SERVERS, _request_timeout=30)
        return self._by_namespace(found.items)

    def pods(self) -> dict[str, list[dict[str, Any]]]:
        found = self.core.list_pod_for_all_namespaces(label_selector=SERVERS, _request_timeout=30)
        return self._by_namespace(found.items)

    def namespaces(self, run: str) -> list[str]:
        """The namespaces of this run still there (terminating ones too)."""
        found = self.core.list_namespace(label_selector=f"{RUN_LABEL}={run}", _request_timeout=30)
        return [ns.metadata.name for ns in found.items]

    def failed_creates(self) -> dict[str, list[dict[str, Any]]]:
        found = self.core.list_event_for_all_namespaces(field_selector="reason=FailedCreate", _request_timeout=30)
        return self._by_namespace(found.items)

    def children(self) -> dict[str, list[dict[str, Any]]]:
        """Every labelled child kind the operator makes (PodMonitors are checked through their owner's deletion)."""
        selector = {"label_selector": INFERENCE_LABEL, "_request_timeout": 30}
        lists = [
            self.apps.list_deployment_for_all_namespaces(**selector),
            self.core.list_service_for_all_namespaces(**selector),
            self.core.list_service_account_for_all_namespaces(**selector),
            self.core.list_config_map_for_all_namespaces(**selector),
            self.net.list_network_policy_for_all_namespaces(**selector),
            self.policy.list_pod_disruption_budget_for_all_namespaces(**selector),
        ]
        return self._by_namespace([item for found in lists for item in found.items])


def stale(fleet: dict[str, Any], deployment: dict[str, Any]) -> str:
    """How the live Deployment differs from the one ``mmfleet render`` makes of the fleet's spec, for the cloud its
    status names and the operator's default collector (both harnesses run it so): containers' image, command and
    args; replicas, or with autoscaling within its bounds. "" when it does not."""
    cloud = (fleet.get("status") or {}).get("cloud") or "generic"
    try:
        inference = parse(fleet)
        children = render.render(inference, cloud, monitoring_crds=True, collector_endpoint=COLLECTOR_ENDPOINT)
    except SpecError as error:  # served, yet refused by the operator's own parser: a finding, not a traceback
        return f"a spec mmfleet render refuses: {error}"
    want = next(c for c in children if c["kind"] == "Deployment" and c["metadata"]["name"] == fleet["metadata"]["name"])
    want = want["spec"]
    have = deployment.get("spec") or {}

    def containers(spec: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
        found = spec["template"]["spec"]["containers"]
        return {c["name"]: (c.get("image"), c.get("command"), c.get("args")) for c in found}

    differ = []
    if containers(have) != containers(want):
        differ.append(f"containers {containers(have)} instead of {containers(want)}")
    autoscaling = inference.spec.autoscaling if inference.spec.autoscaled else None
    replicas = have.get("replicas")
    if autoscaling is None and replicas != want["replicas"]:
        differ.append(f"replicas {replicas} instead of {want['replicas']}")
    spare = inference.spec.standby.replicas if inference.spec.standby is not None else 0  # warm standby's, beside
    low, high = (autoscaling.min_replicas + spare, autoscaling.max_replicas + spare) if autoscaling else (0, 0)
    if autoscaling is not None and not low <= (replicas or 0) <= high:
        differ.append(f"replicas {replicas} outside {low}-{high}")
    return "; ".join(differ)


def judge(fleet: dict[str, Any], deployments: list[Any], pods: list[Any], failed: list[Any]) -> tuple[str, str]:
    """(verdict, why) for one fleet as it stands; verdict "" while it may still change. A status for the fleet's
    generation over a Deployment rendered from another spec is a finding: the operator applies before it says so."""
    status, generation = fleet.get("status") or {}, fleet["metadata"].get("generation")
    if status.get("observedGeneration") != generation:
        return "", f"observedGeneration {status.get('observedGeneration')} of generation {generation}"
    ready = _condition(fleet, "Ready")
    message = str(ready.get("message") or "")
    if ready.get("reason") in ("InvalidSpec", "PolicyDenied"):
        if PROBLEM.match(message):
            return REFUSED, message
        return "refusals not naming a field", message
    if ready.get("reason") in ("ApplyRefused", "ChildNotOwned"):
        return "accepted specs whose children the API server refuses", f"{ready.get('reason')}: {message}"
    refusals = [e.get("message", "") for e in failed if "exceeded quota" not in (e.get("message") or "")]
    if refusals:
        return "accepted specs whose pods the API server refuses", refusals[0]
    if not deployments:
        return "", f"status written ({ready.get('reason')}), no Deployment yet"
    differ = stale(fleet, deployments[0])
    if differ:
        return "children not from the fleet's generation", f"generation {generation}: {differ}"
    # The endpoint picker's pod (routing mode inferencePool) takes one of the namespace's pods.
    picker = 1 if (fleet.get("spec") or {}).get("routing", {}).get("mode") == "inferencePool" else 0
    want = min(int(deployments[0]["spec"].get("replicas") or 0), QUOTA_PODS - picker)
    if len(pods) < want:
        return "", f"{len(pods)} of {want} pods created"
    return SERVED, f"{ready.get('reason')}: {message}"


def tracebacks(text: str) -> list[str]:
    """The operator's log records (a time-stamped line and what follows it) that carry a Python traceback: one per
    record, however many chained exceptions it prints."""
    return [record for record in re.split(r"\n(?=\[\d{4}-\d\d-\d\d )", text) if TRACEBACK in record]


def retry_loops(text: str, namespaces: list[str]) -> dict[str, tuple[int, str]]:
    """Per fleet namespace, the warning or error the operator logged most often (count, line without digits), when
    logged more than ``RETRY_LIMIT`` times."""
    counts: dict[str, Counter[str]] = {ns: Counter() for ns in namespaces}
    prefix = re.compile(r"^\[[^]]*\]\s*")  # kopf's time stamp
    pattern = re.compile(r"\b(" + "|".join(re.escape(ns) for ns in namespaces) + r")/") if namespaces else None
    for line in text.splitlines():
        if pattern is None or not re.search(r"\[(WARNING|ERROR)", line):
            continue
        found = pattern.search(line)
        if found:
            counts[found.group(1)][re.sub(r"\d+", "#", prefix.sub("", line))[:300]] += 1
    loops = {}
    for ns, seen in counts.items():
        if seen:
            line, count = seen.most_common(1)[0]
            if count > RETRY_LIMIT:
                loops[ns] = (count, line)
    return loops


def _wait_all(what: Callable[[], list[str]], bound: float) -> list[str]:
    """Poll ``what`` (the names still waited for) until it is empty or ``bound`` seconds passed; what is left."""
    deadline = time.monotonic() + bound
    left = what()
    while left and time.monotonic() < deadline:
        time.sleep(2)
        left = what()
    return left


def live(
    api: Any,
    planned: list[Plan],
    operator: Running,
    tally: Tally,
    progress: Progress,
    batch: int = BATCH,
    bound: float = BOUND,
) -> None:
    """The live leg: each planned body created for real in a namespace of its own, ``batch`` at a time, then updated
    when planned."""
    from kubernetes.client.exceptions import ApiException

    cluster = _Cluster(api)
    run = uuid.uuid4().hex[:5]
    # The log is read on from where the last batch's reading ended, so nothing logged between batches is skipped.
    offset = operator.log.stat().st_size if operator.log.exists() else 0

    def logged_since() -> str:
        nonlocal offset
        data = operator.log.read_bytes() if operator.log.exists() else b""
        text, offset = data[offset:].decode(errors="replace"), len(data)
        return text

    for start in range(0, len(planned), batch):
        if operator.exited() is not None:
            tally.fail("crashes", None, f"the operator exited with {operator.exited()} before batch {start}")
            return
        fleets = [_Live(f"fz-{run}-{start + i}", plan) for i, plan in enumerate(planned[start : start + batch])]
        _namespaces(cluster, run, fleets, bound)
        for fleet in fleets:
            body = {**fleet.body, "metadata": {**fleet.body["metadata"], "namespace": fleet.namespace}}
            fleet.created = time.monotonic()
            try:
                cluster.custom.create_namespaced_custom_object(
                    GROUP, VERSION, fleet.namespace, PLURAL, body, field_validation="Strict", _request_timeout=30
                )
            except ApiException as error:  # accepted in the dry run: a refusal now is a finding of its own
                fleet.verdict = "accepted in the dry run, refused when created"
                tally.fail(fleet.verdict, body, str(error.body))
            else:
                if fleet.plan.racing:  # the next request: the operator's first reconcile is at most under way
                    _apply_update(cluster, fleet, tally)
        tally.counts["live"] += len(fleets)
        unhealthy = _observe(cluster, fleets, operator, tally, bound)
        unhealthy += _update(cluster, fleets, operator, tally, bound)
        if unhealthy:
            tally.fail("/healthz failures", None, f"{unhealthy} failed polls in batch {start}")
        _delete(cluster, fleets, tally, bound)
        text = logged_since()
        for record in tracebacks(text):
            tally.fail("crashes", None, f"a traceback in the operator's log: {record[:1500]}")
        for ns, (count, line) in retry_loops(text, [f.namespace for f in fleets]).items():
            sample = next(f.sample() for f in fleets if f.namespace == ns)
            tally.fail("retry loops", sample, f"{count} times in the batch: {line}")
        done = Counter(f"{f.leg}: {f.verdict}" for f in fleets)
        progress(f"live {start + len(fleets)}/{len(planned)}: {dict(done)}")
    # The last batch's namespaces going away is the operator's last work here: a crash or a traceback then counts too.
    _wait_all(lambda: cluster.namespaces(run), bound)
    for record in tracebacks(logged_since()):
        tally.fail("crashes", None, f"a traceback in the operator's log: {record[:1500]}")
    if operator.exited() is not None:
        tally.fail("crashes", None, f"the operator exited with {operator.exited()} after the last batch")


def _namespaces(cluster: _Cluster, run: str, fleets: list[_Live], bound: float) -> None:
    """Each fleet's namespace, enforcing "restricted", with its pod quota counted (a quota without status refuses
    every pod until the quota controller fills it in)."""
    for fleet in fleets:
        labels = {**RESTRICTED, RUN_LABEL: run}
        cluster.core.create_namespace({"metadata": {"name": fleet.namespace, "labels": labels}}, _request_timeout=30)
        quota = {"metadata": {"name": "fuzz-pods"}, "spec": {"hard": {"pods": str(QUOTA_PODS)}}}
        cluster.core.create_namespaced_resource_quota(fleet.namespace, quota, _request_timeout=30)
    names = {f.namespace for f in fleets}

    def uncounted() -> list[str]:
        quotas = cluster.core.list_resource_quota_for_all_namespaces(
            field_selector="metadata.name=fuzz-pods", _request_timeout=30
        )
        counted = {q.metadata.namespace for q in quotas.items if q.status and q.status.hard}
        return sorted(names - counted)

    left = _wait_all(uncounted, bound)
    if left:
        raise TimeoutError(f"the quota controller counted no pods in {left[:5]} within {bound:.0f} s")


def _observe(cluster: _Cluster, fleets: list[_Live], operator: Running, tally: Tally, bound: float) -> int:
    """Poll until every fleet is judged or ``bound`` passed since its creation; the failed /healthz polls."""
    unhealthy = 0
    why: dict[str, str] = {}
    while True:
        pending = [f for f in fleets if not f.verdict]
        if not pending:
            return unhealthy
        unhealthy += not healthy(operator.healthz)
        if operator.exited() is not None:
            for fleet in pending:
                fleet.verdict = "crashes"
                tally.fail("crashes", fleet.sample(), f"the operator exited with {operator.exited()}")
            return unhealthy
        listed = cluster.fleets(), cluster.deployments(), cluster.pods(), cluster.failed_creates()
        fleets_by_ns, deployments, pods, failed = listed
        now = time.monotonic()
        for fleet in pending:
            ns = fleet.namespace
            found = fleets_by_ns.get(ns, [])
            verdict, why[ns] = (
                judge(found[0], deployments.get(ns, []), pods.get(ns, []), failed.get(ns, []))
                if found
                else ("", "the fleet is not listed")
            )
            if verdict:
                fleet.verdict = verdict
                if verdict in ANSWERED:
                    tally.add(f"{fleet.leg}: {verdict}")
                    if verdict == SERVED and pods.get(ns):
                        tally.add(f"{fleet.leg}: served, pods admitted")
                else:
                    tally.fail(verdict, fleet.sample(), why[ns])
                _as_planned(fleet, tally)
            elif now - fleet.created > bound:
                fleet.verdict = "silent"
                tally.fail("silent", fleet.sample(), f"after {bound:.0f} s: {why[ns]}")
        time.sleep(2)


def _as_planned(fleet: _Live, tally: Tally) -> None:
    """A planted shape's verdict against its plan; the shape counts as planned once its update is."""
    if not fleet.plan.shape:
        return
    expected = fleet.plan.expect[fleet.leg == "update"]
    if fleet.verdict != expected:
        tally.fail("shapes not answered as planned", fleet.sample(), f"{fleet.verdict}, not {expected}")
    elif fleet.leg == "update":
        tally.add("update shapes as planned")


def _apply_update(cluster: _Cluster, fleet: _Live, tally: Tally) -> bool:
    """The fleet's spec replaced by its plan's update, as ``kubectl apply`` of a changed file replaces it (metadata,
    the operator's finalizer included, kept); whether the API server took it."""
    from kubernetes.client.exceptions import ApiException

    assert fleet.plan.update is not None
    spec = fleet.plan.update["spec"]
    fleet.leg, fleet.body = "update", {**fleet.body, "spec": spec}
    try:
        patched = cluster.custom.patch_namespaced_custom_object(
            GROUP, VERSION, fleet.namespace, PLURAL, fleet.body["metadata"]["name"],
            [{"op": "replace", "path": "/spec", "value": spec}],
            field_validation="Strict", _content_type="application/json-patch+json", _request_timeout=30,
        )  # fmt: skip
    except ApiException as error:
        if error.status not in (400, 422):  # not a refusal of the spec: the run cannot judge this update
            raise
        fleet.verdict = API_REFUSED
        tally.add("updates refused by the API server")
        if not refusal_names_fields(error.body):
            tally.fail("API server refusals not naming a field", fleet.sample(), str(error.body))
        if fleet.plan.expect[1] != API_REFUSED:  # a spec the API server accepted on create (the CRD has no oldSelf)
            tally.fail("accepted on create, refused as an update", fleet.sample(), str(error.body))
        _as_planned(fleet, tally)
        return False
    if patched["metadata"].get("generation", 0) < 2:  # the same spec again: no generation 2 to judge
        tally.add("updates that changed nothing")
        return False
    fleet.verdict, fleet.created = "", time.monotonic()
    tally.add("updates")
    if fleet.plan.racing:
        tally.add("updates racing the creation")
    return True


def _update(cluster: _Cluster, fleets: list[_Live], operator: Running, tally: Tally, bound: float) -> int:
    """Generation 2 of each answered fleet planned for it, judged as its creation was. The failed /healthz polls."""
    answered = [f for f in fleets if f.plan.update is not None and not f.plan.racing and f.verdict in ANSWERED]
    updated = [fleet for fleet in answered if _apply_update(cluster, fleet, tally)]
    return _observe(cluster, updated, operator, tally, bound)


def _delete(cluster: _Cluster, fleets: list[_Live], tally: Tally, bound: float) -> None:
    """Delete the batch's fleets; within ``bound`` they and their children must be gone. Then their namespaces."""
    from kubernetes.client.exceptions import ApiException

    names = {f.namespace for f in fleets}
    for fleet in fleets:
        try:
            cluster.custom.delete_namespaced_custom_object(
                GROUP, VERSION, fleet.namespace, PLURAL, fleet.body["metadata"]["name"], _request_timeout=30
            )
        except ApiException as error:
            if error.status != 404:  # refused when created
                raise

    def remaining() -> list[str]:
        left = {ns for ns in cluster.fleets() if ns in names} | {ns for ns in cluster.children() if ns in names}
        return sorted(left)

    for ns in _wait_all(remaining, bound):
        sample = next(f.sample() for f in fleets if f.namespace == ns)
        tally.fail("stuck deletions", sample, f"fleet or children of namespace {ns} still there after {bound:.0f} s")
    for ns in sorted(names):
        cluster.core.delete_namespace(ns, _request_timeout=30)


FAILURES = (
    "crashes",
    "hangs",
    "silent",
    "retry loops",
    "stuck deletions",
    "/healthz failures",
    "API server refusals not naming a field",
    "operator refusals not naming a field",
    "refusals not naming a field",
    "accepted specs whose children the API server refuses",
    "accepted specs whose pods the API server refuses",
    "accepted in the dry run, refused when created",
    "accepted on create, refused as an update",
    "children not from the fleet's generation",
    "shapes not answered as planned",
    "YAML attacks kubectl accepted",
    "YAML attacks the operator reads",
)
HEADERS = [
    "seed",
    "specs",
    "refused by the API server",
    "accepted",
    "dry run: refused by the operator naming the field",
    "dry run: every child and the pod accepted",
    "live: served (with pods admitted)",
    "live: refused naming the field (InvalidSpec)",
    "updates: applied (refused by the API server)",
    "of which racing the creation",
    "updates: served (with pods admitted, of either generation)",
    "updates: refused naming the field",
    "update shapes as planned",
    "silent",
    "children not from the spec",
    "children or pods refused",
    "crashes",
    "hangs",
    "retry loops",
    "stuck deletions",
    "/healthz failures",
    "refusals not naming a field",
    "minutes",
]


def row(seed: int, tally: Tally, minutes: float) -> list[object]:
    c = tally.counts
    refused_children = sum(
        c[k]
        for k in (
            "accepted specs whose children the API server refuses",
            "accepted specs whose pods the API server refuses",
            "accepted in the dry run, refused when created",
            "accepted on create, refused as an update",
        )
    )
    unnamed = sum(
        c[k]
        for k in (
            "API server refusals not naming a field",
            "operator refusals not naming a field",
            "refusals not naming a field",
        )
    )
    return [
        seed,
        f"{c['specs']:,}",
        f"{c['refused by the API server']:,}",
        c["accepted by the API server"],
        c["accepted, refused by the operator"],
        c["accepted, every child accepted"],
        f"{c['live: served']} ({c['live: served, pods admitted']})" if c["live"] else "-",
        c["live: refused naming the field"] if c["live"] else "-",
        f"{c['updates']} ({c['updates refused by the API server']})" if c["live"] else "-",
        c["updates racing the creation"] if c["live"] else "-",
        f"{c['update: served']} ({c['update: served, pods admitted']})" if c["live"] else "-",
        c["update: refused naming the field"] if c["live"] else "-",
        f"{c['update shapes as planned']}/{len(UPDATE_SHAPES)}" if c["live"] else "-",
        c["silent"],
        c["children not from the fleet's generation"],
        refused_children,
        c["crashes"],
        c["hangs"],
        c["retry loops"],
        c["stuck deletions"],
        c["/healthz failures"],
        unnamed,
        f"{minutes:.1f}",
    ]


def failed(tally: Tally) -> bool:
    return any(tally.counts[kind] for kind in FAILURES)


CLUSTER = "mmfleet-fuzz"
DOCS_KEY = "fuzz"
TITLE = "Generated specs through the API server and the running operator (`mmfleet bench fuzz`)"
PODMONITOR_FILE = "monitoring.coreos.com_podmonitors.yaml"


def _optional_crds(api: Any) -> None:
    """The released CRDs of the optional child kinds (the Prometheus Operator's PodMonitor, the Inference Extension's
    InferencePool, the Gateway API's HTTPRoute), so those children are rendered and validated too."""

    from mmfleet_lab.cluster.inference_extension import (
        HTTPROUTE_CRD,
        INFERENCE_POOL_CRD,
        gateway_api_crds,
        inference_extension_crds,
    )
    from mmfleet_lab.cluster.prometheus_operator import prometheus_operator_crds

    for path in (
        prometheus_operator_crds() / PODMONITOR_FILE,
        inference_extension_crds() / f"{INFERENCE_POOL_CRD}.yaml",
        gateway_api_crds() / f"{HTTPROUTE_CRD}.yaml",
    ):
        install_crd(api, yaml.safe_load(path.read_text()), "mmfleet-fuzz", timeout=30)


def _live_under_operator(
    cluster: Any, seed: int, accepted: list[dict[str, Any]], tally: Tally, progress: Progress, batch: int
) -> None:
    """The live leg with ``mmfleet run`` as its own process, reading the cluster's Prometheus, /healthz served."""
    import os

    log = cluster.state_dir / f"operator-fuzz-{seed}.log"
    health = f"127.0.0.1:{process.free_port()}"
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "MMFLEET_PROMETHEUS_URL": cluster.prometheus_url,
        "MMFLEET_POLICY": OPEN_POLICY,
    }
    command = [sys.executable, "-m", "mmfleet.cli", "run", "--health-address", health, "--metrics-address", ""]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    running = Running(proc.poll, log, f"http://{health}/healthz")
    try:
        if _wait_all(lambda: [] if healthy(running.healthz) or proc.poll() is not None else ["up"], 60):
            raise TimeoutError(f"the operator's /healthz did not answer within 60 s; see {log}")
        live(cluster.api_client(), plans(accepted, seed), running, tally, progress, batch)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        progress(f"seed {seed}: the operator's log is {log}")


def _commit() -> str:
    """The commit of the source tree that ran, with "+ changes" when it differs from it."""
    where = str(examples_dir().parent)
    git = ["git", "-C", where]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    dirty = subprocess.run([*git, "status", "--porcelain", "operator"], capture_output=True, text=True, check=False)
    return (head.stdout.strip() or "unknown") + (" + changes" if dirty.stdout.strip() else "")


def main(
    seeds: list[int],
    count: int,
    with_live: bool,
    docs: Path,
    progress: Progress,
    batch: int = BATCH,
    report: Path | None = None,
) -> int:
    """``mmfleet bench fuzz``: a fresh local cluster; per seed the dry run, the YAML attacks and (``with_live``) the
    live leg under ``mmfleet run``; the table into ``docs`` (key ``fuzz``); exit 1 on any failure."""
    from kubernetes import client

    from mmfleet_lab.bench.operator_scale import NAMESPACE, _install
    from mmfleet_lab.bench.report import table, write_section
    from mmfleet_lab.cluster import down, up

    cluster = up(CLUSTER, pod_ready_delay="2s", progress=progress)
    rows, tallies = [], {}
    try:
        api = _install(cluster)
        client.CoreV1Api(api).patch_namespace(NAMESPACE, {"metadata": {"labels": RESTRICTED}})
        _optional_crds(api)
        for seed in seeds:
            tally, started = Tally(), time.monotonic()
            specs = generated(count, seed)
            accepted = dry_run(api, NAMESPACE, specs, tally)
            yaml_attacks(cluster.kubeconfig, cluster.state_dir, tally)
            progress(f"seed {seed}: dry run {dict(tally.counts)} in {time.monotonic() - started:.0f} s")
            if with_live:
                _live_under_operator(cluster, seed, accepted, tally, progress, batch)
            minutes = (time.monotonic() - started) / 60
            rows.append(row(seed, tally, minutes))
            tallies[seed] = tally
            progress(table(HEADERS, [rows[-1]]))
    finally:
        down(CLUSTER, progress=progress)
    if report is not None:
        report.write_text(
            json.dumps(
                {
                    str(s): {"counts": dict(t.counts), "failures": t.failures, "kubectl": t.yaml}
                    for s, t in tallies.items()
                },
                indent=1,
                default=str,
            )
        )
    command = " ".join(
        ["mmfleet bench fuzz", *(f"--seed {s}" for s in seeds), f"--count {count}", *(["--live"] if with_live else [])]
    )
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = f"{table(HEADERS, rows)}\n\nReproduce: `{command}` (this table: commit {_commit()}, {when})"
    write_section(docs, DOCS_KEY, TITLE, body, level=3)
    print(table(HEADERS, rows))
    return 1 if any(failed(t) for t in tallies.values()) else 0
