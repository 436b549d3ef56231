"""The encode tier's processes as mmfleet renders them, made runnable on one GPU host (issue 27's real measurement).

Two steps, on two machines:

- ``render`` (here, with mmfleet installed): ``examples/qwen-vl-encode-tier.yaml`` through ``mmfleet.render`` into one
  JSON file: the serving pod's server container and encode sidecar, the encode pod's server container (command and
  env each), the encode Service's address, and whether the ConfigMap's ``encode_proxy.py`` is this checkout's file;
- ``shell`` (on the GPU host; standard library only, so the file is run there as a script): the three processes as
  bash arrays, with only the deviations that one host forces (``DEVIATIONS`` lists each; the run's README repeats
  them): the model is a local config directory with dummy weights, the encode server leaves port 8000 to the
  sidecar, the two servers split the GPU's memory, the side channel and the encode "Service" are on localhost.

``epd_run.sh`` beside this file evaluates the ``shell`` output and starts the processes.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "qwen-vl-encode-tier.yaml"
PROXY_SOURCE = Path(__file__).resolve().parents[2] / "mmfleet" / "encode_proxy.py"
MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
ENCODE_PORT = 8100  # the encode server's port on the shared host (its pod's is 8000, the sidecar's there too)
SIDE_CHANNEL_HOST = "127.0.0.1"
MEMORY = {"encode": "0.25", "server": "0.65"}  # --gpu-memory-utilization on the shared GPU (rendered: 0.9 each)
DEVIATIONS = (
    "vllm serve -> python3 -m vllm.entrypoints.cli.main serve (the host has no vllm console script)",
    "the containers' removal of stale /dev/shm/vllm_ec_*.mmap before vLLM starts left out (one /dev/shm for both)",
    f"model {MODEL} -> a local directory (Qwen2.5-VL-7B's config, Qwen2's tokenizer) with --load-format dummy",
    f"encode server --port 8000 -> --port {ENCODE_PORT} (the sidecar holds 8000 on the shared host)",
    f"--gpu-memory-utilization 0.9 -> {MEMORY['encode']} (encode) and {MEMORY['server']} (prefill/decode)",
    f"VLLM_EC_SIDE_CHANNEL_HOST status.podIP -> {SIDE_CHANNEL_HOST}",
    f"sidecar --encoder http://<name>-encode.<ns>.svc:8000 -> http://127.0.0.1:{ENCODE_PORT}",
    "sidecar /etc/mmfleet/encode_proxy.py -> this checkout's operator/mmfleet/encode_proxy.py (the ConfigMap's copy)",
    "env added: HF_HUB_OFFLINE=1, VLLM_USE_FLASHINFER_SAMPLER=0 (no FlashInfer on the host), PYTHONPATH and "
    "LD_LIBRARY_PATH (the carried vLLM, its dependencies, NIXL), VLLM_LOGGING_CONFIG_PATH (the EC connector's "
    "scheduler at DEBUG, to see each transfer)",
)


def render_example(example: Path) -> dict[str, Any]:
    """The rendered containers of the example's two tiers (mmfleet's own render, nothing copied)."""
    import yaml

    from mmfleet import render
    from mmfleet.api import MultimodalInference
    from mmfleet.backends import vllm

    inference = MultimodalInference.model_validate(yaml.safe_load(example.read_text()))
    cloud = "generic" if inference.spec.cloud == "auto" else inference.spec.cloud
    out: dict[str, Any] = {"example": example.name, "deviations": list(DEVIATIONS)}
    for child in render.render(inference, cloud):
        kind, name = child["kind"], child["metadata"]["name"]
        if kind == "ConfigMap" and "encode_proxy.py" in child.get("data", {}):
            out["configmap_proxy_is_checkout_file"] = child["data"]["encode_proxy.py"] == PROXY_SOURCE.read_text()
        if kind == "Service" and name.endswith("-encode"):
            out["encode_service"] = f"{name}.{child['metadata']['namespace']}.svc"
        if kind != "Deployment":
            continue
        tier = "encode" if name.endswith("-encode") else "server"
        for container in child["spec"]["template"]["spec"]["containers"]:
            key = tier if container["name"] == render.CONTAINER else f"{tier}:{container['name']}"
            out[key] = {"command": vllm.serve_argv(container["command"]), "env": container.get("env", [])}
    return out


def _flag(argv: list[str], name: str, value: str) -> list[str]:
    index = argv.index(name)
    return [*argv[: index + 1], value, *argv[index + 2 :]]


def _env(entries: list[dict[str, Any]], overrides: dict[str, str]) -> list[str]:
    pairs = []
    for entry in entries:
        name = entry["name"]
        if name in overrides:
            pairs.append(f"{name}={overrides[name]}")
        elif "value" in entry:
            pairs.append(f"{name}={entry['value']}")
        else:
            raise SystemExit(f"env {name} has no value and no override: {entry}")
    return pairs


def shell(rendered: dict[str, Any], model: str, python: str, proxy: str) -> str:
    """bash arrays E_CMD, PD_CMD, PROXY_CMD and E_ENV, PD_ENV, PROXY_ENV (NAME=value each)."""
    lines = []
    for tier, var in (("encode", "E"), ("server", "PD")):
        argv = list(rendered[tier]["command"])
        assert argv[:3] == ["vllm", "serve", MODEL], argv
        argv = [python, "-m", "vllm.entrypoints.cli.main", "serve", model, *argv[3:], "--load-format", "dummy"]
        argv = _flag(argv, "--gpu-memory-utilization", MEMORY[tier])
        if tier == "encode":
            assert argv[argv.index("--port") + 1] == "8000", argv
            argv = _flag(argv, "--port", str(ENCODE_PORT))
        env = _env(rendered[tier]["env"], {"VLLM_EC_SIDE_CHANNEL_HOST": SIDE_CHANNEL_HOST})
        lines.append(f"{var}_CMD=({' '.join(shlex.quote(a) for a in argv)})")
        lines.append(f"{var}_ENV=({' '.join(shlex.quote(e) for e in env)})")
    sidecar = list(rendered["server:encode-proxy"]["command"])
    assert sidecar[:2] == ["python3", "/etc/mmfleet/encode_proxy.py"], sidecar
    service = f"http://{rendered['encode_service']}:8000"
    assert sidecar[sidecar.index("--encoder") + 1] == service, (sidecar, service)
    sidecar = _flag([python, proxy, *sidecar[2:]], "--encoder", f"http://127.0.0.1:{ENCODE_PORT}")
    lines.append(f"PROXY_CMD=({' '.join(shlex.quote(a) for a in sidecar)})")
    proxy_env = _env(rendered["server:encode-proxy"]["env"], {})
    lines.append(f"PROXY_ENV=({' '.join(shlex.quote(e) for e in proxy_env)})")
    return "\n".join(lines) + "\n"


def main(arguments: list[str] | None = None) -> int:
    top = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    step = top.add_subparsers(dest="step", required=True)
    render_step = step.add_parser("render", help="render the example's containers (needs mmfleet)")
    render_step.add_argument("--example", type=Path, default=EXAMPLE)
    render_step.add_argument("--out", type=Path, required=True)
    shell_step = step.add_parser("shell", help="bash arrays of the three processes (standard library only)")
    shell_step.add_argument("--rendered", type=Path, required=True)
    shell_step.add_argument("--model", required=True, help="the local model directory")
    shell_step.add_argument("--python", default="python3")
    shell_step.add_argument("--proxy", default=str(PROXY_SOURCE))
    args = top.parse_args(arguments)
    if args.step == "render":
        args.out.write_text(json.dumps(render_example(args.example), indent=1) + "\n")
        return 0
    sys.stdout.write(shell(json.loads(args.rendered.read_text()), args.model, args.python, args.proxy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
