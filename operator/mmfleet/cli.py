"""The ``mmfleet`` command. Invalid input exits 2 with one line per problem, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from mmfleet import apidocs, crd, render
from mmfleet.api import CloudName
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

    p_crd = sub.add_parser("crd", help="print the CustomResourceDefinition")
    p_crd.set_defaults(func=cmd_crd)

    p_docs = sub.add_parser("docs", help="print generated documentation")
    p_docs.add_argument("what", choices=["api"], help="api: the API reference (docs/api.md)")
    p_docs.set_defaults(func=cmd_docs)
    return top


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
