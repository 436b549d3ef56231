"""The vLLM command lines mmfleet renders, checked by vLLM 0.33's own argument parser and engine configuration.

Two steps, on two machines:

- ``render`` (here, with mmfleet installed): every vLLM example of ``examples/`` and the spec variants of ``VARIANTS``
  (the ``spec.multimodal`` knobs, the encode tier), rendered to the containers' command lines (the serving tier's,
  and the encode tier's as ``<case>:encode``), into one JSON file;
- ``check`` (where vLLM 0.33.0 is installed; this step needs vLLM and the standard library only, so the file is run
  there as a script): each command line parsed as ``vllm serve`` parses it (the ``serve`` subcommand's own parser,
  ``validate_parsed_serve_args``), then made into vLLM's engine configuration
  (``AsyncEngineArgs.from_cli_args(...).create_engine_config()``, with the API server processes set as
  ``run_multi_api_server`` sets them), with the model replaced by a local model directory (Qwen2.5-VL-7B's config):
  the checks vLLM makes before it loads anything. The result, per case, is written as JSON, the parsed multimodal
  and encoder-transfer settings included. On a GPU host, or with ``--no-gpu`` on any Linux machine with a C
  compiler: vLLM's CUDA platform then stands for an 8-GPU H200 node, and its compiled libraries load against a stub
  of the CUDA driver entry points they link to (each answers "no device"); no kernel runs in either step.

tests/data/vllm_0.33.0_flags_checked.json is the result, and tests/unit/lab/test_vllm_flags_checked.py fails when
what mmfleet renders drifts from the command lines it holds:
``python operator/mmfleet_lab/gpu/check_flags.py render --out flags.json`` (with mmfleet), then
``python check_flags.py check --no-gpu --commands flags.json --model <dir> --out <file>`` (the file above)
with vLLM 0.33.0 (``pip install vllm==0.33.0`` in a virtual environment of its own) and the model directory
``tests/data/qwen25vl7b_model`` (Qwen2.5-VL-7B's config files, copied from the calibration notes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
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
    # spec.disaggregation.encode: the serving tier (ec_consumer) and the encode tier (ec_producer, ":encode").
    "encode-tier": {**QWEN, "disaggregation": {"encode": {"replicas": 2, "gpu": {"count": 1}, "cacheGiB": 2.5}}},
    "encode-tier-tp2": {
        **QWEN,
        "gpu": {"count": 2, "type": "H200"},
        "multimodal": {"encoderTensorParallel": "data"},
        "disaggregation": {"encode": {"gpu": {"count": 2}}},
    },
    "encode-tier-standby": {
        **QWEN,
        "routing": {"mode": "inferencePool"},
        "autoscaling": {"slo": {"target": "2s"}, "warmStandby": {"replicas": 1}},
        "disaggregation": {"encode": {}},
    },
}


def cases(examples: Path) -> dict[str, list[str]]:
    """Every case's rendered container command (mmfleet's flags, the drain flag, extraArgs), by name."""
    import yaml

    from mmfleet import render, routing
    from mmfleet.api import MultimodalInference
    from mmfleet.backends import vllm

    specs: dict[str, dict[str, Any]] = {}
    for path in sorted(examples.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            served = document and (document.get("spec", {}).get("backend") or {}).get("name", "vllm") == "vllm"
            if served and document.get("kind") == "MultimodalInference":
                specs[f"example:{path.name}"] = document
    for name, spec in VARIANTS.items():
        specs[name] = {"apiVersion": "mmfleet.io/v1alpha1", "kind": "MultimodalInference",
                       "metadata": {"name": "qwen", "namespace": "ml"}, "spec": spec}  # fmt: skip
    commands: dict[str, list[str]] = {}
    for name, document in specs.items():
        inference = MultimodalInference.model_validate(document)
        cloud = "generic" if inference.spec.cloud == "auto" else inference.spec.cloud
        for child in render.render(inference, cloud):
            if child["kind"] != "Deployment" or child["metadata"]["name"].endswith(routing.PICKER_SUFFIX):
                continue
            (server,) = [c for c in child["spec"]["template"]["spec"]["containers"] if c["name"] == render.CONTAINER]
            tier = child["metadata"]["name"] != inference.metadata.name
            commands[f"{name}:encode" if tier else name] = vllm.serve_argv(server["command"])
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
    # The pods of both tiers of an encode tier run the V2 model runner (render: VLLM_USE_V2_MODEL_RUNNER=1).
    v2 = "--ec-transfer-config" in argv
    if v2:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    try:
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except BaseException as error:
        result["engine_config"] = f"{type(error).__name__}: {error}"
        result["trace"] = traceback.format_exc(limit=4)[-1500:]
        return result
    finally:
        if v2:
            del os.environ["VLLM_USE_V2_MODEL_RUNNER"]
    result["engine_config"] = "ok"
    # What the V2 model runner (the ECCPUConnector's) would not support in this configuration (config/vllm.py).
    result["v2_model_runner_unsupported"] = list(config._get_v2_model_runner_unsupported_features())
    mm = config.model_config.multimodal_config
    result["multimodal"] = {
        "limit_per_prompt": {k: vars(v) for k, v in mm.limit_per_prompt.items()},
        "mm_processor_cache_gb": mm.mm_processor_cache_gb,
        "mm_processor_cache_type": mm.mm_processor_cache_type,
        "mm_encoder_tp_mode": mm.mm_encoder_tp_mode,
        "api_process_count": config.parallel_config._api_process_count,
        "api_server_count": args.api_server_count,
        "mm_encoder_only": mm.mm_encoder_only,
    }
    ec = config.ec_transfer_config
    if ec is not None:
        result["ec_transfer"] = {
            "ec_connector": ec.ec_connector,
            "ec_role": ec.ec_role,
            "ec_connector_extra_config": ec.ec_connector_extra_config,
            "is_encode_only": ec.is_encode_only,
        }
    return result


# The CUDA driver entry points vLLM 0.33's compiled libraries link to (objdump -T on its *.so files, undefined "cu*").
DRIVER_SYMBOLS = (
    "cuCtxGetCurrent", "cuCtxSetCurrent", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain", "cuDriverGetVersion",
    "cuGetErrorString", "cuGetProcAddress_v2", "cuMemAddressFree", "cuMemAddressReserve", "cuMemCreate",
    "cuMemGetAllocationGranularity", "cuMemMap", "cuMemRelease", "cuMemSetAccess", "cuMemUnmap",
    "cuPointerGetAttribute", "cuTensorMapEncodeTiled",
)  # fmt: skip
NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE
STUB_DIR_ENV = "MMFLEET_CUDA_STUB_DIR"


def _driver_stub() -> Path:
    """A libcuda.so.1 whose every entry point answers "no device", built with the machine's C compiler."""
    folder = Path(tempfile.mkdtemp(prefix="cuda-stub-"))
    source = folder / "cuda_stub.c"
    source.write_text("".join(f"int {name}(void) {{ return {NO_DEVICE}; }}\n" for name in DRIVER_SYMBOLS))
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"), str(source)], check=True)
    return folder


def _stand_in_for_a_gpu_node() -> None:
    """vLLM's CUDA platform as on an 8-GPU H200 node (compute capability 9.0), for the configuration's checks."""
    import torch
    from vllm import platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    patches: dict[str, Any] = {
        "get_device_capability": lambda cls, device_id=0: DeviceCapability(9, 0),
        "get_device_name": lambda cls, device_id=0: "NVIDIA H200",
        "get_device_total_memory": lambda cls, device_id=0: 150_000_000_000,
        "device_count": lambda cls: 8,
        "is_fully_connected": lambda cls, ids: True,
        "is_cumem_allocator_available": lambda cls: True,  # sleep mode's allocator, there on any CUDA GPU
    }
    for name, function in patches.items():
        setattr(CudaPlatform, name, classmethod(function))
    torch.cuda.device_count = lambda: 8
    torch.cuda.is_available = lambda: True
    platforms.current_platform = CudaPlatform()


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
    check_step.add_argument("--no-gpu", action="store_true", help="on a machine with no GPU (see the docstring)")
    args = top.parse_args(arguments)
    if args.step == "render":
        args.out.write_text(json.dumps(cases(args.examples), indent=1) + "\n")
        return 0
    if args.no_gpu and STUB_DIR_ENV not in os.environ:
        # The dynamic loader reads LD_LIBRARY_PATH at start: run again with the stub driver on it.
        stub = _driver_stub()
        env = {
            **os.environ,
            STUB_DIR_ENV: str(stub),
            "LD_LIBRARY_PATH": f"{stub}:{os.environ.get('LD_LIBRARY_PATH', '')}",
        }
        again = sys.argv[1:] if arguments is None else arguments
        return subprocess.run([sys.executable, __file__, *again], env=env, check=False).returncode
    if args.no_gpu:
        _stand_in_for_a_gpu_node()
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
