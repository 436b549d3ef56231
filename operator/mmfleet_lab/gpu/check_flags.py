"""The vLLM command lines mmfleet renders, checked by vLLM 0.33's own argument parser and engine configuration.

Two steps, on two machines:

- ``render`` (here, with mmfleet installed): every vLLM example of ``examples/`` and the spec variants of ``VARIANTS``
  (the ``spec.multimodal`` knobs), rendered to the container's command line, into one JSON file;
- ``check`` (where vLLM 0.33.0 is installed: the GPU host; this step needs vLLM and the standard library only, so the
  file is run there as a script): each command line parsed as ``vllm serve`` parses it (the ``serve`` subcommand's
  own parser, ``validate_parsed_serve_args``), then made into vLLM's engine configuration
  (``AsyncEngineArgs.from_cli_args(...).create_engine_config()``, with the API server processes set as
  ``run_multi_api_server`` sets them), with the model replaced by a local model directory (Qwen2.5-VL-7B's config):
  the checks vLLM makes before it loads anything. The result, per case, is written as JSON, the parsed multimodal
  settings included.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
QWEN = {"model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct"}, "gpu": {"count": 1, "type": "H200"}, "cloud": "eks"}
# The spec.multimodal knobs (issue 27), each with the fields it renders.
VARIANTS: dict[str, dict[str, Any]] = {
    "multimodal-knobs": {
        **QWEN,
        "multimodal": {
            "limitPerPrompt": {"image": 4, "video": 1},
            "largestItem": {"image": {"width": 1280, "height": 720}, "video": {"frames": 32, "width": 640}},
            "processorCache": {"sizeGiB": 8, "type": "lru"},
            "encoderTensorParallel": "data",
            "apiServers": 2,
        },
    },
    "multimodal-shm-cache": {**QWEN, "multimodal": {"processorCache": {"sizeGiB": 2.5, "type": "shm"}}},
    "multimodal-largest-item-alone": {**QWEN, "multimodal": {"largestItem": {"image": {"height": 448}}}},
}


def cases(examples: Path) -> dict[str, list[str]]:
    """Every case's rendered container command (mmfleet's flags, the drain flag, extraArgs), by name."""
    import yaml

    from mmfleet import render
    from mmfleet.api import MultimodalInference

    specs: dict[str, dict[str, Any]] = {}
    for path in sorted(examples.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            vllm = document and (document.get("spec", {}).get("backend") or {}).get("name", "vllm") == "vllm"
            if vllm and document.get("kind") == "MultimodalInference":
                specs[f"example:{path.name}"] = document
    for name, spec in VARIANTS.items():
        specs[name] = {"apiVersion": "mmfleet.io/v1alpha1", "kind": "MultimodalInference",
                       "metadata": {"name": "qwen", "namespace": "ml"}, "spec": spec}  # fmt: skip
    commands: dict[str, list[str]] = {}
    for name, document in specs.items():
        inference = MultimodalInference.model_validate(document)
        cloud = "generic" if inference.spec.cloud == "auto" else inference.spec.cloud
        children = render.render(inference, cloud)
        (server,) = [
            container
            for child in children
            if child["kind"] == "Deployment"
            for container in child["spec"]["template"]["spec"]["containers"]
            if container["name"] == render.CONTAINER
        ]
        commands[name] = server["command"]
    return commands


def check(argv: list[str], model: str) -> dict[str, Any]:
    """One command line through vLLM's own ``serve`` parser and engine configuration; what each said."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    assert argv[:2] == ["vllm", "serve"], argv
    parser = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand()  # as vllm's own entrypoints/cli/main.py builds and validates it
    serve.subparser_init(parser.add_subparsers(dest="subparser", required=True))
    result: dict[str, Any] = {"argv": argv}
    try:
        args = parser.parse_args(["serve", model, *argv[3:]])
        serve.validate(args)
    except BaseException as error:  # argparse exits with SystemExit on an unknown flag or a bad value
        result["parsed"] = f"{type(error).__name__}: {error}"
        return result
    result["parsed"] = "ok"
    args.model = args.model_tag  # what ServeSubcommand.cmd does first
    engine_args = AsyncEngineArgs.from_cli_args(args)
    servers = args.api_server_count or 1  # as ServeSubcommand.cmd defaults it with data parallel 1
    if servers > 1:  # as run_multi_api_server sets them before it makes the engine configuration
        engine_args._api_process_count = servers
        engine_args._api_process_rank = -1
    try:
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except BaseException as error:
        result["engine_config"] = f"{type(error).__name__}: {error}"
        result["trace"] = traceback.format_exc(limit=4)[-1500:]
        return result
    result["engine_config"] = "ok"
    mm = config.model_config.multimodal_config
    result["multimodal"] = {
        "limit_per_prompt": {k: vars(v) for k, v in mm.limit_per_prompt.items()},
        "mm_processor_cache_gb": mm.mm_processor_cache_gb,
        "mm_processor_cache_type": mm.mm_processor_cache_type,
        "mm_encoder_tp_mode": mm.mm_encoder_tp_mode,
        "api_process_count": config.parallel_config._api_process_count,
        "api_server_count": args.api_server_count,
    }
    return result


def main(arguments: list[str] | None = None) -> int:
    top = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    step = top.add_subparsers(dest="step", required=True)
    render_step = step.add_parser("render", help="render the cases' command lines (needs mmfleet)")
    render_step.add_argument("--examples", type=Path, default=EXAMPLES)
    render_step.add_argument("--out", type=Path, required=True)
    check_step = step.add_parser("check", help="check each command line with vLLM's parser (needs vLLM)")
    check_step.add_argument("--commands", type=Path, required=True)
    check_step.add_argument("--model", required=True, help="a local model directory standing for every model")
    check_step.add_argument("--out", type=Path, required=True)
    args = top.parse_args(arguments)
    if args.step == "render":
        args.out.write_text(json.dumps(cases(args.examples), indent=1) + "\n")
        return 0
    commands: dict[str, list[str]] = json.loads(args.commands.read_text())
    import vllm

    results = {"vllm": vllm.__version__, "model": args.model, "cases": {}}
    for name, argv in commands.items():
        results["cases"][name] = check(argv, args.model)
        print(name, results["cases"][name].get("parsed"), results["cases"][name].get("engine_config"), flush=True)
    args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    failed = [n for n, r in results["cases"].items() if r.get("engine_config") != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
