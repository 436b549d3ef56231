"""The ``mmfleet`` command. Invalid input exits 2 with one line per problem, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import ValidationError

from mmfleet import apidocs, crd, render
from mmfleet.admin_policy import AdminPolicy
from mmfleet.api import CLOUD_NAMES, KIND, PROFILE_NAMES, CloudName
from mmfleet.render import SpecError
from mmfleet.validation import describe, parse

EXIT_INVALID = 2


# A MultimodalInference is a few levels deep and a few hundred values; these bounds leave wide room above that
# and refuse alias bombs (YAML "billion laughs") and deep nesting before anything expands or recurses.
MAX_DEPTH = 64
MAX_VALUES = 100_000
MAX_INT_DIGITS = 4300  # Python's own limit on converting a string to an int (sys.get_int_max_str_digits)
_INT_TAG = "tag:yaml.org,2002:int"


def _check_nodes(root: yaml.Node, label: str) -> None:
    """Refuse a document that nests too deep, expands to too many values through aliases, or holds an integer Python
    will not convert; walked without recursion and with a budget, so a cyclic or exponential alias graph ends early."""
    stack: list[tuple[yaml.Node, str, int]] = [(root, "", 0)]
    seen = 0
    while stack:
        node, path, depth = stack.pop()
        where = f"{label}: {path or '(document)'}"
        seen += 1
        if seen > MAX_VALUES:
            raise SpecError([f"{where}: more than {MAX_VALUES} values once YAML aliases are expanded (an alias bomb?); "
                             "a MultimodalInference needs a few hundred"])  # fmt: skip
        if depth > MAX_DEPTH:
            raise SpecError([f"{where}: nested more than {MAX_DEPTH} levels deep; no field of a MultimodalInference "
                             "nests beyond a few levels"])  # fmt: skip
        if isinstance(node, yaml.ScalarNode) and node.tag == _INT_TAG and len(node.value) > MAX_INT_DIGITS:
            raise SpecError([f"{where}: an integer of {len(node.value)} digits (line {node.start_mark.line + 1}); "
                             "no field accepts more than 19"])  # fmt: skip
        if isinstance(node, yaml.SequenceNode):
            stack += [(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = f"{path}.{key.value}" if isinstance(key, yaml.ScalarNode) else f"{path}.(key)"
                stack += [(key, name.lstrip("."), depth + 1), (value, name.lstrip("."), depth + 1)]


def _yaml_error(label: str, error: yaml.YAMLError) -> str:
    """One line: where the parser stopped and why (PyYAML's own message spans several, with a caret)."""
    mark = getattr(error, "problem_mark", None)
    if mark is None:
        return f"{label}: not valid YAML: {' '.join(str(error).split())}"
    return f"{label}: not valid YAML: line {mark.line + 1}, column {mark.column + 1}: {getattr(error, 'problem', '')}"


def load_documents(data: bytes, label: str) -> list[Any]:
    """The non-empty YAML documents in ``data``; anything unreadable is a ``SpecError`` naming where, never a crash."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SpecError([f"{label}: not UTF-8 text: byte {data[error.start]:#04x} on line {line}"]) from None
    documents = []
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except RecursionError:
        raise SpecError([f"{label}: nested more than {MAX_DEPTH} levels deep; no field of a MultimodalInference "
                         "nests beyond a few levels"]) from None  # fmt: skip
    except yaml.YAMLError as error:
        raise SpecError([_yaml_error(label, error)]) from None
    for index, node in enumerate(nodes):
        if node is None:
            continue
        _check_nodes(node, f"{label}#{index}" if index else label)
        try:
            documents.append(yaml.constructor.SafeConstructor().construct_document(node))
        except yaml.YAMLError as error:
            raise SpecError([_yaml_error(label, error)]) from None
        except ValueError as error:  # a scalar YAML tags as a timestamp that is no date, such as 2026-13-45
            raise SpecError([f"{label}: a value YAML cannot read: {error}"]) from None
    return [document for document in documents if document is not None]


def _documents(path: str, expected: str = "one or more MultimodalInference resources") -> list[Any]:
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as stream:
                data = stream.read()
    except OSError as error:
        raise SpecError([f"{path}: {error.strerror}"]) from None
    documents = load_documents(data, path)
    if not documents:
        raise SpecError([f"{path}: empty; expected {expected}"])
    return documents


def _collector_endpoint(value: str) -> str:
    from mmfleet.config import otlp_endpoint

    try:
        return otlp_endpoint(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{value!r}: {error}") from None


def _policy(path: str) -> AdminPolicy:
    """The admin policy in a YAML file: chart values holding it under ``policy``, or the policy alone."""
    expected = "one policy mapping (the policy alone, or chart values holding it under `policy`)"
    documents = _documents(path, expected)
    if len(documents) != 1:
        raise SpecError([f"{path}: {len(documents)} YAML documents; expected {expected}"])
    document = documents[0]
    wrapped = isinstance(document, dict) and "policy" in document
    if wrapped:
        document = document["policy"]
    if document is None:
        fields = ", ".join(f.alias or name for name, f in AdminPolicy.model_fields.items())
        raise SpecError([f"{path}: {'policy: ' if wrapped else ''}empty; expected a mapping of some of {fields}"])
    try:
        return AdminPolicy.model_validate(document)
    except ValidationError as error:
        raise SpecError([f"{path}: {line}" for line in describe(error, AdminPolicy)]) from None


def cmd_render(args: argparse.Namespace) -> int:
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    if args.file == "-" and args.policy == "-":
        raise SpecError(["-f - and --policy -: both read standard input, which is read once; give one as a file"])
    policy = _policy(args.policy) if args.policy else None
    documents = _documents(args.file)
    others = [d.get("kind") for d in documents if isinstance(d, dict) and d.get("kind") not in (None, KIND)]
    if len(others) == len(documents):
        kinds = ", ".join(sorted(set(map(str, others))))
        raise SpecError([f"{args.file}: no {KIND} (kind: {kinds}); expected one or more {KIND} resources"])
    for index, document in enumerate(documents):
        if isinstance(document, dict) and document.get("kind") not in (None, KIND):
            continue
        try:
            inference = parse(document, policy)
        except SpecError as error:
            label = f"{args.file}#{index}" if index else args.file
            problems += [f"{label}: {line}" for line in error.problems]
            continue
        cloud: CloudName = args.cloud or inference.spec.cloud
        out += render.render(
            inference,
            "generic" if cloud == "auto" else cloud,
            monitoring_crds=args.monitoring_crds,
            collector_endpoint=args.collector_endpoint,
        )
    if problems:
        raise SpecError(problems)
    sys.stdout.write(yaml.safe_dump_all(out, sort_keys=False, width=120))
    return 0


def cmd_collector_config(args: argparse.Namespace) -> int:
    """The collector configuration for a cloud; credentials stay ``${env:...}`` references."""
    from mmfleet.clouds import collector

    values: dict[str, Any] = {"cloud": args.cloud}
    for field in ("region", "endpoint", "insecure", "ack_backend", "sls_project", "sls_logstore"):
        if getattr(args, field) is not None:
            values[field] = getattr(args, field)
    attributes: dict[str, str] = {}
    for item in args.resource_attribute:
        key, equals, value = item.partition("=")
        if not equals:
            raise SpecError([f"--resource-attribute: {item!r}: not KEY=VALUE"])
        attributes[key] = value
    if attributes:
        values["resource_attributes"] = attributes
    try:
        settings = collector.CollectorSettings.parse(**values)
    except ValueError as error:
        raise SpecError(str(error).splitlines()) from None
    if args.kustomize_env:
        patch = collector.kustomize_env_patch(settings)
        sys.stdout.write(collector.to_yaml(patch, header=collector.env_patch_header(settings)))
        return 0
    sys.stdout.write(collector.to_yaml(collector.collector_config(settings), header=collector.header(settings)))
    return 0


def cmd_crd(_: argparse.Namespace) -> int:
    sys.stdout.write(crd.crd_yaml())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import logging

    import kopf

    from mmfleet.config import OperatorConfig

    overrides = {
        "namespaces": tuple(args.namespace) or None,
        "prometheus_url": args.prometheus_url,
        "default_cloud": args.default_cloud,
        "log_format": args.log_format,
        "health_address": args.health_address,
        "metrics_address": args.metrics_address,
    }
    try:
        config = OperatorConfig.load(**{k: v for k, v in overrides.items() if v is not None})
    except ValueError as error:
        print(f"mmfleet run: {error}", file=sys.stderr)
        return EXIT_INVALID
    from mmfleet.kube import CredentialsError, credentials

    try:  # before kopf, which would retry its startup forever on credentials that can never work
        credentials()
    except CredentialsError as error:
        print(f"mmfleet run: {error}", file=sys.stderr)
        return EXIT_INVALID
    # Imported here, not at the top: the other commands (render, crd, docs) need none of the operator's runtime.
    from mmfleet import handlers, metrics_export
    from mmfleet.leader import Elector, lease_namespace

    log_format = kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.FULL
    kopf.configure(verbose=args.verbose, log_format=log_format)
    logging.getLogger("mmfleet").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    # kopf logs a line per handler call ("Handler 'watch_pods' succeeded."), one per watch event: at 1,000 fleets,
    # tens of thousands of lines and a twentieth of the operator's CPU. Its warnings and errors stay.
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    op = handlers.Operator(config=config)
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    stop_metrics = metrics_export.serve(config.metrics_address) if config.metrics_address else None
    # Only the Lease's holder acts (it waits here until then); losing the Lease ends the process.
    elector = None
    if config.leader_election_lease:
        namespace = lease_namespace(config.leader_election_namespace)
        elector = Elector(op.get_kube(), namespace, config.leader_election_lease)
        elector.wait()
        elector.keep()
    try:
        kopf.run(
            registry=registry,
            memo=handlers.memo(op),
            standalone=True,
            clusterwide=not config.namespaces,
            namespaces=list(config.namespaces),
            liveness_endpoint=_liveness_endpoint(config.health_address),
        )
    finally:
        if elector is not None:
            elector.release()
        if stop_metrics is not None:
            stop_metrics()
    return 0


def _liveness_endpoint(address: str) -> str | None:
    """kopf's liveness endpoint URL for ``host:port`` (``[::]:8080`` for IPv6); None turns it off."""
    if not address:
        return None
    host, _, port = address.rpartition(":")
    return f"http://{host or '0.0.0.0'}:{port}/healthz"


def cmd_docs(_: argparse.Namespace) -> int:
    sys.stdout.write(apidocs.api_markdown())
    return 0


OPERATOR_COMMANDS = ("render", "run", "crd", "docs", "collector-config")
# Where the lab (installed with the ``lab`` extra) adds its sub-commands: demo, bench, cluster, twin.
COMMANDS_ENTRY_POINT = "mmfleet.commands"


def _add_lab_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> list[str]:
    """Sub-commands other packages register; one that cannot be imported (lab absent) is left out.

    Returns why each was left out, for a user who asks for one of its commands.
    """
    from importlib.metadata import entry_points

    missing = []
    for entry in entry_points(group=COMMANDS_ENTRY_POINT):
        try:
            register = entry.load()
        except ImportError as error:
            missing.append(str(error))
            continue
        register(sub)
    return missing


def parser(with_lab: bool = True) -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="mmfleet", description="Fleets of multimodal inference servers on Kubernetes.")
    sub = top.add_subparsers(dest="command", required=True)

    p_render = sub.add_parser("render", help="print the child manifests of a MultimodalInference as YAML")
    p_render.add_argument("-f", "--file", required=True, help="YAML file with one or more resources, or - for stdin")
    p_render.add_argument("--cloud", choices=PROFILE_NAMES, help="cloud profile (default: spec.cloud; auto: generic)")
    p_render.add_argument(
        "--monitoring-crds", action="store_true", help="render the PodMonitor as if Prometheus Operator were installed"
    )
    p_render.add_argument(
        "--collector-endpoint",
        type=_collector_endpoint,
        help="where pods with tracing on and no spec.tracing.endpoint send spans, as the operator's "
        "MMFLEET_COLLECTOR_ENDPOINT says (default: the collector installed with the operator)",
    )
    p_render.add_argument(
        "--policy",
        help="YAML file with the admin policy (the chart's policy value): refuse what it does not allow, as the "
        "operator would (default: no policy check)",
    )
    p_render.set_defaults(func=cmd_render)

    p_run = sub.add_parser("run", help="run the operator against the cluster in KUBECONFIG (or in-cluster)")
    p_run.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch only this namespace (repeatable; default: all)"
    )
    p_run.add_argument("--prometheus-url", help="Prometheus the autoscaler queries (env MMFLEET_PROMETHEUS_URL)")
    p_run.add_argument("--default-cloud", choices=CLOUD_NAMES, help="profile for spec.cloud: auto")
    p_run.add_argument("--log-format", choices=["plain", "json"], help="log format (env MMFLEET_LOG_FORMAT)")
    p_run.add_argument(
        "--health-address", help="host:port of kopf's /healthz; empty: none (env MMFLEET_HEALTH_ADDRESS)"
    )
    p_run.add_argument(
        "--metrics-address", help="host:port of the operator's /metrics; empty: none (env MMFLEET_METRICS_ADDRESS)"
    )
    p_run.add_argument("-v", "--verbose", action="store_true", help="debug logs")
    p_run.set_defaults(func=cmd_run)

    p_crd = sub.add_parser("crd", help="print the CustomResourceDefinition")
    p_crd.set_defaults(func=cmd_crd)

    p_docs = sub.add_parser("docs", help="print generated documentation")
    p_docs.add_argument("what", choices=["api"], help="api: the API reference (docs/api.md)")
    p_docs.set_defaults(func=cmd_docs)

    p_collector = sub.add_parser("collector-config", help="print the OpenTelemetry Collector configuration for a cloud")
    p_collector.add_argument("--cloud", choices=PROFILE_NAMES, default="generic", help="cloud (default: generic)")
    p_collector.add_argument("--region", help="eks: the X-Ray region (default: ${env:AWS_REGION})")
    p_collector.add_argument("--endpoint", help="where spans go (default: from the collector's Secret; eks: X-Ray)")
    p_collector.add_argument(
        "--insecure", action=argparse.BooleanOptionalAction, default=None, help="ack (arms), generic: no TLS"
    )
    p_collector.add_argument("--ack-backend", choices=["arms", "sls"], help="ack: ARMS (default) or SLS")
    p_collector.add_argument("--sls-project", help="ack sls: the SLS project (default: from the Secret)")
    p_collector.add_argument("--sls-logstore", help="ack sls: the logstore (default: from the Secret)")
    p_collector.add_argument(
        "--resource-attribute", action="append", default=[], metavar="KEY=VALUE", help="on every span (repeatable)"
    )
    p_collector.add_argument(
        "--kustomize-env",
        action="store_true",
        help="print instead the kustomize patch giving the collector's container the Secret's keys it reads",
    )
    p_collector.set_defaults(func=cmd_collector_config)
    if with_lab:
        missing = _add_lab_commands(sub)
        if missing:
            top.epilog = "Not available here: " + "; ".join(missing)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The operator's own commands never import the lab: `mmfleet run` starts without numpy.
    top = parser(with_lab=not argv or argv[0] not in OPERATOR_COMMANDS)
    if argv and not argv[0].startswith("-") and argv[0] not in OPERATOR_COMMANDS and top.epilog:
        print(f"mmfleet {argv[0]}: {top.epilog}", file=sys.stderr)
        return EXIT_INVALID
    args = top.parse_args(argv)
    try:
        code: int = args.func(args)
    except SpecError as error:
        for line in error.problems:
            print(line, file=sys.stderr)
        return EXIT_INVALID
    return code


if __name__ == "__main__":
    sys.exit(main())
