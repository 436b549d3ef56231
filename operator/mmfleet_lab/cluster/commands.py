"""``mmfleet cluster up|down|env|status``: the local cluster from the command line.

Progress goes to stderr and the ``export KUBECONFIG=...`` (and ``MMFLEET_PROMETHEUS_URL``) lines to
stdout, so ``eval "$(mmfleet cluster up)"`` points the shell at the new cluster.
"""

from __future__ import annotations

import argparse
import sys

from mmfleet_lab.cluster.build import BuildError
from mmfleet_lab.cluster.cluster import DEFAULT_NAME, down, env, status, up
from mmfleet_lab.cluster.nodes import DEFAULT_POOLS, parse_pool
from mmfleet_lab.cluster.process import ClusterError
from mmfleet_lab.cluster.prometheus import DEFAULT_SCRAPE_INTERVAL


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _cmd_up(args: argparse.Namespace) -> int:
    try:
        pools = tuple(parse_pool(p) for p in args.pool) if args.pool else DEFAULT_POOLS
        cluster = up(
            args.name,
            state_dir=args.state_dir,
            pod_ready_delay=args.pod_ready_delay,
            nodes=() if args.no_nodes else pools,
            progress=_progress,
            with_prometheus=not args.no_prometheus,
            scrape_interval=args.scrape_interval,
        )
    except (ClusterError, BuildError, TimeoutError, ValueError) as error:
        print(f"mmfleet cluster up: {error}", file=sys.stderr)
        return 1
    suffix = "" if args.name == DEFAULT_NAME else f" --name {args.name}"
    print(cluster.env_line())
    print(f"# stop it with: mmfleet cluster down{suffix}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    try:
        down(args.name, progress=_progress)
    except ClusterError as error:
        print(f"mmfleet cluster down: {error}", file=sys.stderr)
        return 1
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    try:
        print(env(args.name))
    except ClusterError as error:
        print(f"mmfleet cluster env: {error}", file=sys.stderr)
        return 1
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    try:
        report = status(args.name)
    except ClusterError as error:
        print(f"mmfleet cluster status: {error}", file=sys.stderr)
        return 1
    print(report)
    return 0 if report.startswith(f"cluster {args.name}: running") else 1


def register_cli(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cluster`` with its ``up|down|env|status`` subcommands; each sets ``func`` returning an exit code."""
    p_cluster = subparsers.add_parser(
        "cluster",
        help="run a local control plane (etcd, kube-apiserver, kcm, scheduler) with kwok GPU nodes and Prometheus",
    )
    sub = p_cluster.add_subparsers(dest="cluster_command", required=True)

    def named(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help_text)
        parser.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default: {DEFAULT_NAME})")
        return parser

    p_up = named("up", "start the cluster (builds the binaries on first use), or reuse a running one")
    p_up.add_argument("--state-dir", help="where state and logs go (default: ~/.cache/mmfleet/clusters/NAME)")
    p_up.add_argument(
        "--pod-ready-delay",
        default="5s",
        help="how long a bound pod takes to turn Ready, e.g. 5s or 500ms (default: 5s)",
    )
    p_up.add_argument(
        "--pool",
        action="append",
        metavar="CLOUD:GPU:COUNT",
        help="a fake GPU node pool, repeatable (default: eks:H100:2, 8 GPUs per node)",
    )
    p_up.add_argument("--no-nodes", action="store_true", help="create no nodes")
    p_up.add_argument(
        "--scrape-interval",
        default=DEFAULT_SCRAPE_INTERVAL,
        help=f"Prometheus' scrape and evaluation interval, e.g. 15s or 500ms (default: {DEFAULT_SCRAPE_INTERVAL})",
    )
    p_up.add_argument("--no-prometheus", action="store_true", help="start no Prometheus")
    p_up.set_defaults(func=_cmd_up)
    named("down", "stop every component and delete the cluster's state").set_defaults(func=_cmd_down)
    named("env", "print export KUBECONFIG=... and MMFLEET_PROMETHEUS_URL=... for the cluster").set_defaults(
        func=_cmd_env
    )
    named("status", "show the components' pids and health, and Prometheus' URL").set_defaults(func=_cmd_status)
