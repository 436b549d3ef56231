"""The ``mmfleet`` command. Invalid input exits 2 with one line per problem, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from mmfleet import apidocs, crd, render
from mmfleet.api import CloudName
from mmfleet.localcluster import register_cli
from mmfleet.render import SpecError
from mmfleet.validation import parse

EXIT_INVALID = 2


def _documents(path: str) -> list[Any]:
    try:
        stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    except OSError as error:
        raise SpecError([f"{path}: {error.strerror}"]) from None
    with stream:
        try:
            return [doc for doc in yaml.safe_load_all(stream) if doc is not None]
        except yaml.YAMLError as error:
            raise SpecError([f"{path}: not valid YAML: {error}"]) from None


def cmd_render(args: argparse.Namespace) -> int:
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    for index, document in enumerate(_documents(args.file)):
        if isinstance(document, dict) and document.get("kind") not in (None, "MultimodalInference"):
            continue
        try:
            inference = parse(document)
        except SpecError as error:
            label = f"{args.file}#{index}" if index else args.file
            problems += [f"{label}: {line}" for line in error.problems]
            continue
        cloud: CloudName = args.cloud or inference.spec.cloud
        out += render.render(inference, "generic" if cloud == "auto" else cloud, monitoring_crds=args.monitoring_crds)
    if problems:
        raise SpecError(problems)
    sys.stdout.write(yaml.safe_dump_all(out, sort_keys=False, width=120))
    return 0


def cmd_crd(_: argparse.Namespace) -> int:
    sys.stdout.write(crd.crd_yaml())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import dataclasses
    import logging

    import kopf

    from mmfleet import controller
    from mmfleet.config import OperatorConfig

    overrides = {
        "namespaces": tuple(args.namespace) or None,
        "prometheus_url": args.prometheus_url,
        "default_cloud": args.default_cloud,
        "log_format": args.log_format,
        "health_address": args.health_address,
    }
    try:
        config = OperatorConfig.from_env()
        config = dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})
    except ValueError as error:
        print(f"mmfleet run: {error}", file=sys.stderr)
        return EXIT_INVALID
    controller.STATE.config = config
    log_format = kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.FULL
    kopf.configure(verbose=args.verbose, log_format=log_format)
    logging.getLogger("mmfleet").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    kopf.run(
        standalone=True,
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        liveness_endpoint=f"http://{config.health_address}/healthz" if config.health_address else None,
    )
    return 0


def cmd_demo(_: argparse.Namespace) -> int:
    from mmfleet.demo import run_demo

    return run_demo()


def cmd_bench_operator(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mmfleet.bench import operator_scale

    return operator_scale.main(args.count or [100], Path(args.docs), args.timeout, _progress)


def cmd_bench_autoscale(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mmfleet.bench import autoscale
    from mmfleet.twin.scenarios import TraceFile

    trace = None
    if args.trace:
        if not args.time_column:
            print(f"--time-column: required with --trace {args.trace} (the name of its timestamp column)")
            return 2
        trace = TraceFile(
            path=args.trace,
            time_column=args.time_column,
            input_column=args.input_column,
            output_column=args.output_column,
            images_column=args.images_column,
            count_column=args.count_column,
            time_scale=args.time_scale,
        )
    default = ["trace"] if trace is not None else list(autoscale.STEADY + autoscale.SPIKY)
    scenarios = args.scenario or default
    cold_starts = args.cold_start or list(autoscale.COLD_STARTS)
    return autoscale.main(scenarios, cold_starts, Path(args.docs), Path(args.plots), _progress, trace=trace)


def cmd_twin_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mmfleet.localcluster import ClusterError
    from mmfleet.twin import serve

    try:
        spikes = tuple(serve.Spike.parse(text) for text in args.spike)
        spec = serve.TrafficSpec(
            name=args.scenario,
            rate=args.rate,
            spikes=spikes,
            duration=args.duration,
            seed=args.seed,
            traces=Path(args.traces) if args.traces else None,
        )
        return serve.serve(args.cluster, spec, port=args.port, profile=args.profile)
    except ValueError as error:
        print(f"mmfleet twin serve: {error}", file=sys.stderr)
        return EXIT_INVALID
    except (ClusterError, FileNotFoundError, OSError) as error:
        print(f"mmfleet twin serve: {error}", file=sys.stderr)
        return 1


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_docs(_: argparse.Namespace) -> int:
    sys.stdout.write(apidocs.api_markdown())
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="mmfleet", description="Fleets of multimodal inference servers on Kubernetes.")
    sub = top.add_subparsers(dest="command", required=True)

    p_render = sub.add_parser("render", help="print the child manifests of a MultimodalInference as YAML")
    p_render.add_argument("-f", "--file", required=True, help="YAML file with one or more resources, or - for stdin")
    p_render.add_argument(
        "--cloud", choices=["eks", "aks", "ack", "generic"], help="cloud profile (default: spec.cloud; auto: generic)"
    )
    p_render.add_argument(
        "--monitoring-crds", action="store_true", help="render the PodMonitor as if Prometheus Operator were installed"
    )
    p_render.set_defaults(func=cmd_render)

    p_run = sub.add_parser("run", help="run the operator against the cluster in KUBECONFIG (or in-cluster)")
    p_run.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch only this namespace (repeatable; default: all)"
    )
    p_run.add_argument("--prometheus-url", help="Prometheus the autoscaler queries (env MMFLEET_PROMETHEUS_URL)")
    p_run.add_argument(
        "--default-cloud", choices=["auto", "eks", "aks", "ack", "generic"], help="profile for spec.cloud: auto"
    )
    p_run.add_argument("--log-format", choices=["plain", "json"], help="log format (env MMFLEET_LOG_FORMAT)")
    p_run.add_argument("--health-address", help="host:port of /healthz; empty to disable (env MMFLEET_HEALTH_ADDRESS)")
    p_run.add_argument("-v", "--verbose", action="store_true", help="debug logs")
    p_run.set_defaults(func=cmd_run)

    p_crd = sub.add_parser("crd", help="print the CustomResourceDefinition")
    p_crd.set_defaults(func=cmd_crd)

    p_demo = sub.add_parser("demo", help="local control plane, operator, examples: watch them become Ready")
    p_demo.set_defaults(func=cmd_demo)

    p_bench = sub.add_parser("bench", help="benchmarks; each writes its table to docs/benchmarks.md")
    bench = p_bench.add_subparsers(dest="bench", required=True)
    p_bop = bench.add_parser("operator", help="N resources on the local control plane: time to Ready, cost, memory")
    p_bop.add_argument("--count", type=int, action="append", help="resources per run (repeatable; default 100)")
    p_bop.add_argument("--timeout", type=float, default=300, help="seconds to wait for all Ready after the last apply")
    p_bop.add_argument("--docs", default="docs/benchmarks.md", help="where the table is written")
    p_bop.set_defaults(func=cmd_bench_operator)
    p_bas = bench.add_parser("autoscale", help="every policy and the oracle in the digital twin, on real traces")
    p_bas.add_argument("--scenario", action="append", help="scenario (repeatable; default: all)")
    p_bas.add_argument("--cold-start", type=float, action="append", help="cold start L in s (repeatable)")
    p_bas.add_argument("--docs", default="docs/benchmarks.md", help="where the tables are written")
    p_bas.add_argument("--plots", default="docs/img", help="where the PNG plots are written")
    p_bas.add_argument("--trace", help="your own CSV: one row per request, or a request count per window")
    p_bas.add_argument("--time-column", help="its timestamp column (seconds, or date-times)")
    p_bas.add_argument("--time-scale", type=float, default=1.0, help="multiply the times by this to get seconds")
    p_bas.add_argument("--input-column", help="prompt tokens column (default: the ServeGen mix)")
    p_bas.add_argument("--output-column", help="output tokens column (default: the ServeGen mix)")
    p_bas.add_argument("--images-column", help="images per request column (default: ServeGen's share)")
    p_bas.add_argument("--count-column", help="requests per window: the file is a count series, not requests")
    p_bas.set_defaults(func=cmd_bench_autoscale)

    register_cli(sub)
    _twin_cli(sub)

    p_docs = sub.add_parser("docs", help="print generated documentation")
    p_docs.add_argument("what", choices=["api"], help="api: the API reference (docs/api.md)")
    p_docs.set_defaults(func=cmd_docs)
    return top


def _twin_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from mmfleet.localcluster.cluster import DEFAULT_NAME
    from mmfleet.twin.replica import PROFILES
    from mmfleet.twin.serve import DEFAULT_DURATION, DEFAULT_PROFILE, DEFAULT_RATE, TRAFFIC_NAMES

    p_twin = sub.add_parser("twin", help="the digital twin of a fleet")
    twin = p_twin.add_subparsers(dest="twin", required=True)
    p_serve = twin.add_parser(
        "serve",
        help="simulate the inference servers of a local cluster's pods in real time, with metrics for Prometheus",
    )
    p_serve.add_argument("--cluster", default=DEFAULT_NAME, help=f"local cluster name (default: {DEFAULT_NAME})")
    p_serve.add_argument("--port", type=int, default=0, help="HTTP port on 127.0.0.1 (default: any free one)")
    p_serve.add_argument(
        "--scenario",
        default=TRAFFIC_NAMES[0],
        choices=TRAFFIC_NAMES,
        help="traffic: Poisson with ServeGen's multimodal mix, or a benchmark scenario (default: poisson)",
    )
    p_serve.add_argument(
        "--rate", type=float, default=DEFAULT_RATE, help=f"mean requests/s per fleet (default: {DEFAULT_RATE:g})"
    )
    p_serve.add_argument(
        "--spike",
        action="append",
        default=[],
        metavar="START:END:FACTOR",
        help="multiply the rate by FACTOR from START to END seconds after start (repeatable), e.g. 60:180:4",
    )
    p_serve.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION,
        help=f"seconds of traffic; afterwards nothing arrives (default: {DEFAULT_DURATION:g})",
    )
    p_serve.add_argument("--seed", type=int, default=0, help="random seed of the arrivals (default: 0)")
    p_serve.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        choices=sorted(PROFILES),
        help=f"replica model (GPU, Qwen2.5-VL-7B) (default: {DEFAULT_PROFILE})",
    )
    p_serve.add_argument("--traces", help="folder with the trace files (default: ../shared/traces, $MMFLEET_TRACES)")
    p_serve.set_defaults(func=cmd_twin_serve)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except SpecError as error:
        for line in error.problems:
            print(line, file=sys.stderr)
        return EXIT_INVALID
    return code


if __name__ == "__main__":
    sys.exit(main())
