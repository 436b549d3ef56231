"""Build the control-plane binaries from upstream Go modules, once, into a versioned cache.

No release tarballs are reachable here, only the Go module proxy, so each component is built from a
small wrapper module under ``<cache>/src/<component>``:

- Kubernetes: ``k8s.io/kubernetes``'s go.mod requires every staging module at the non-existent
  ``v0.0.0`` and replaces it with ``./staging/...``; a wrapper module must replace each one with its
  published ``v0.<minor>.<patch>`` (the list is read from the go.mod the proxy serves), and the
  version is stamped with ``-X`` ldflags like ``hack/lib/version.sh`` so ``/version`` says v1.34.4.
- etcd: ``go.etcd.io/etcd/server/v3`` has ``replace ../...`` directives, so ``go install`` refuses it;
  ``go get`` + ``go build`` in a wrapper works. kwok is built the same way.

- The OpenTelemetry Collector: the OpenTelemetry Collector Builder (``cmd/builder``, installed with ``go
  install`` at the collector's release) generates a ``main`` module holding exactly ``COLLECTOR_COMPONENTS``
  and compiles it (``ensure_collector``).
- Helm: ``helm.sh/helm/v3``'s go.mod has no replace directives, so ``go build ./cmd/helm`` runs inside the
  module the proxy serves, with its own go.sum (``ensure_helm``).
- The Gateway API Inference Extension's endpoint picker: ``sigs.k8s.io/gateway-api-inference-extension`` has no
  replace directives either, so ``./cmd/epp`` is built inside its module (with ``GOWORK=off``: its zip's go.work
  names a module the zip leaves out), stamped like its Dockerfile (``ensure_epp``).
- The llm-d inference simulator (vLLM's API and metrics without a model), likewise inside its module
  (``ensure_inference_sim``); the lab's gateway stand-in, from its source under ``mmfleet_lab/gateway/standin`` with the
  committed go.sum, into a directory named by the hash of that source (``ensure_gateway_standin``).

A build goes into a temporary directory next to its target and is renamed into place, so a
half-built directory never looks complete. A file lock serialises concurrent callers.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from mmfleet.clouds.collector import COLLECTOR_VERSION
from mmfleet.routing import PICKER_VERSION

K8S_VERSION = "1.34.4"
ETCD_VERSION = "3.6.16"
KWOK_VERSION = "0.8.0"
HELM_VERSION = "3.22.0"
EPP_VERSION = PICKER_VERSION.removeprefix("v")  # the operator's pin (mmfleet.routing)
INFERENCE_SIM_VERSION = "0.10.2"

Progress = Callable[[str], None]


def silent(_: str) -> None:
    """Progress sink for library callers that want no output."""


def cache_root() -> Path:
    """``$MMFLEET_CACHE`` or ``~/.cache/mmfleet``: binaries, build modules and cluster state live here."""
    override = os.environ.get("MMFLEET_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "mmfleet"


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every executable the local cluster runs."""

    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    etcd: Path
    kwok: Path


class BuildError(RuntimeError):
    """A build step failed; the message names the step and ends with the tail of its log."""


@dataclass(frozen=True)
class _Component:
    key: str  # the wrapper module's directory under src/
    module: str  # the upstream Go module the binaries come from
    version: str
    binaries: tuple[str, ...]
    packages: tuple[str, ...]  # Go packages, in the order of ``binaries``
    estimate: str
    ldflags: str = "-s -w"

    @property
    def dir_name(self) -> str:
        return f"{self.key}-v{self.version}"


def _k8s_ldflags(version: str) -> str:
    """Version stamps as ``hack/lib/version.sh`` sets them, in the order the hand-run build.sh used."""
    minor = version.split(".")[1]
    base, client = "k8s.io/component-base/version", "k8s.io/client-go/pkg/version"
    stamps = [f"-X {base}.gitVersion=v{version}", f"-X {base}.gitMajor=1", f"-X {base}.gitMinor={minor}"]
    stamps.append(f"-X {base}.gitTreeState=clean")
    stamps += [f"-X {client}.gitVersion=v{version}", f"-X {client}.gitMajor=1", f"-X {client}.gitMinor={minor}"]
    return "-s -w " + " ".join(stamps)


_K8S_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
COMPONENTS = (
    _Component(
        key="k8s",
        module="k8s.io/kubernetes",
        version=K8S_VERSION,
        binaries=_K8S_BINARIES,
        packages=tuple(f"k8s.io/kubernetes/cmd/{b}" for b in _K8S_BINARIES),
        estimate="~6 min",
        ldflags=_k8s_ldflags(K8S_VERSION),
    ),
    _Component(
        key="etcd",
        module="go.etcd.io/etcd/server/v3",
        version=ETCD_VERSION,
        binaries=("etcd",),
        packages=("go.etcd.io/etcd/server/v3",),
        estimate="~2 min",
    ),
    _Component(
        key="kwok",
        module="sigs.k8s.io/kwok",
        version=KWOK_VERSION,
        binaries=("kwok",),
        packages=("sigs.k8s.io/kwok/cmd/kwok",),
        estimate="~2 min",
    ),
)


def bin_dir(component: _Component, root: Path | None = None) -> Path:
    return (root or cache_root()) / component.dir_name / "bin"


def _complete(component: _Component, root: Path) -> bool:
    directory = bin_dir(component, root)
    return all(os.access(directory / name, os.X_OK) for name in component.binaries)


def binaries_at(root: Path) -> Binaries:
    """Where the binaries are (or will be) under ``root``; nothing is built."""
    k8s, etcd, kwok = (bin_dir(c, root) for c in COMPONENTS)
    return Binaries(
        kube_apiserver=k8s / "kube-apiserver",
        kube_controller_manager=k8s / "kube-controller-manager",
        kube_scheduler=k8s / "kube-scheduler",
        kubectl=k8s / "kubectl",
        etcd=etcd / "etcd",
        kwok=kwok / "kwok",
    )


def ensure_binaries(progress: Progress = silent) -> Binaries:
    """Return the binaries, building whichever are missing (minutes, once); instant when cached."""
    root = cache_root()

    def build(go: str) -> None:
        for component in COMPONENTS:
            if not _complete(component, root):  # another process may have built it while we waited
                _build(component, root, go, progress)

    _ensure_built(
        root, lambda: all(_complete(c, root) for c in COMPONENTS), "the local cluster's binaries", "build", build
    )
    return binaries_at(root)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, held for the ``with`` block (processes wait for each other)."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def module_dir(target: str) -> Path:
    """Where ``module@version`` is unpacked in the Go module cache, downloaded first if need be (nothing built): for
    files a module ships, such as released CRDs."""
    go = shutil.which("go")
    if go is None:
        raise BuildError(f"the 'go' command is needed to download {target} and is not on PATH")
    done = subprocess.run(
        [go, "mod", "download", "-json", target],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"},
    )
    if done.returncode != 0:
        raise BuildError(f"'go mod download {target}' failed (exit {done.returncode}): {done.stdout}{done.stderr}")
    return Path(json.loads(done.stdout)["Dir"])


def _ensure_built(root: Path, built: Callable[[], bool], what: str, lock: str, build: Callable[[str], None]) -> None:
    """``build(go)`` unless ``built()``, holding ``<root>/.<lock>.lock``; ``built()`` is asked again under the lock
    because another process may have built it while this one waited."""
    if built():
        return
    go = shutil.which("go")
    if go is None:
        raise BuildError(f"the 'go' command is needed to build {what} and is not on PATH")
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f".{lock}.lock"):
        if not built():
            build(go)


class _Runner:
    """Runs go commands (or a program they built) in a wrapper module, appending their output to one build log."""

    def __init__(self, go: str, workdir: Path, log: Path, progress: Progress) -> None:
        self.go = go
        self.workdir = workdir
        self.log = log
        self.progress = progress
        # Static binaries; never download a toolchain; let go.mod/go.sum be updated as needed.
        self.env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}

    def run(self, *args: str, note: str | None = None, program: str | None = None) -> str:
        """``go <args>``, or ``<program> <args>``; BuildError with the log's tail when it fails."""
        if note:
            self.progress(f"  {note}")
        argv = [program or self.go, *args]
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            done = subprocess.run(
                argv,
                check=False,
                cwd=self.workdir,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
            log.write(done.stdout)
            log.write(f"rc={done.returncode}\n")
        if done.returncode != 0:
            command = " ".join(argv if program else ["go", *args])
            raise BuildError(f"'{command}' failed (exit {done.returncode}); end of {self.log}:\n{_tail(self.log)}")
        return done.stdout


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class _Build:
    """One build of ``final``: a fresh ``build.log`` in ``<cache>/src/<key>``, a runner writing to it, and the
    "building"/"built" progress lines, so every component reports and logs alike."""

    def __init__(self, final: Path, key: str, what: str, estimate: str, go: str, progress: Progress) -> None:
        self.final = final
        self.what = what
        self.progress = progress
        self.workdir = final.parent / "src" / key
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "build.log"
        self.log.write_text(f"# build of {final.name} at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        progress(f"building {what} ... (first time only, {estimate}; log: {self.log})")
        self.started = time.monotonic()
        self.runner = _Runner(go, self.workdir, self.log, progress)

    @contextmanager
    def staging(self) -> Iterator[Path]:
        """A fresh ``<final>.tmp-<pid>`` with a ``bin`` directory, renamed to ``final`` when the block succeeds
        (replacing an incomplete earlier result whole), so a half-built directory never looks complete."""
        staging = self.final.parent / f".{self.final.name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "bin").mkdir(parents=True)
        try:
            yield staging
            if self.final.exists():  # an incomplete earlier result: replace it whole
                shutil.rmtree(self.final)
            os.rename(staging, self.final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        elapsed = time.monotonic() - self.started
        self.progress(f"built {self.what} in {elapsed:.0f}s -> {self.final / 'bin'}")


def _build(component: _Component, root: Path, go: str, progress: Progress) -> None:
    names = ", ".join(component.binaries)
    build = _Build(
        root / component.dir_name, component.key, f"{names} v{component.version}", component.estimate, go, progress
    )
    runner = build.runner
    if not (build.workdir / "go.mod").exists():
        runner.run("mod", "init", f"mmfleet.local/{component.key}bin")
    if component.key == "k8s":
        _require_kubernetes(runner, component.version)
    else:  # no replace directives to undo: requiring the module is enough
        target = f"{component.module}@v{component.version}"
        runner.run("get", target, note=f"go get {target}")

    with build.staging() as staging:
        # With one package, -o names the file (etcd's package would otherwise be called "v3").
        out = staging / "bin" / component.binaries[0] if len(component.packages) == 1 else f"{staging / 'bin'}/"
        runner.run(
            "build",
            "-trimpath",
            "-ldflags",
            component.ldflags,
            "-o",
            str(out),
            *component.packages,
            note=f"go build {names} (compiling; the slow step)",
        )


_STAGING_REPLACE = re.compile(r"^\s*(k8s\.io/\S+)\s+=>\s+\./staging/", re.MULTILINE)


def _require_kubernetes(runner: _Runner, version: str) -> None:
    """Point every staging module at its published v0.x release, then require k8s.io/kubernetes."""
    note = f"go mod download k8s.io/kubernetes@v{version}"
    info = json.loads(runner.run("mod", "download", "-json", f"k8s.io/kubernetes@v{version}", note=note))
    staging = _STAGING_REPLACE.findall(Path(info["GoMod"]).read_text())
    if not staging:
        raise BuildError(f"no './staging' replace lines in k8s.io/kubernetes@v{version}'s go.mod ({info['GoMod']})")
    published = "v0." + version.split(".", 1)[1]
    replaces = [f"-replace={m}={m}@{published}" for m in staging]
    runner.run("mod", "edit", *replaces, f"-require=k8s.io/kubernetes@v{version}")
    packages = [f"k8s.io/kubernetes/cmd/{b}@v{version}" for b in _K8S_BINARIES]
    note = f"go get k8s.io/kubernetes@v{version} ({len(staging)} staging modules replaced by their v0 releases)"
    runner.run("get", *packages, note=note)


# --- the OpenTelemetry Collector -------------------------------------------------------------------------

_CORE = "go.opentelemetry.io/collector"
_CONTRIB = "github.com/open-telemetry/opentelemetry-collector-contrib"
_RELEASE = f"v{COLLECTOR_VERSION}"
# The confmap providers are versioned 1.x beside the 0.x release (the builder's own default manifest pairs
# v0.161.0 with v1.67.0).
_PROVIDERS_VERSION = "v1.67.0"

# (builder manifest section, component type in a config) -> "<Go module> <version>": the components the generated
# configurations use (mmfleet.clouds.collector; a unit test checks both ways) plus the file exporter for tests.
# One release, v0.161.0, except three modules whose v0.161.0 the Go module proxy reachable here does not serve
# (checked 2026-12: .zip or sum.golang.org lookup refused): k8sattributesprocessor at v0.160.0 and
# sigv4authextension at v0.159.0 (their newest served), and resourcedetectionprocessor at v0.158.0 (v0.159.0 on
# import go.opentelemetry.io/contrib/detectors/* modules that are not served at all). Go's minimum version
# selection runs all three on the v0.161.0 core; the shipped image, COLLECTOR_IMAGE, is the whole v0.161.0.
COLLECTOR_COMPONENTS: dict[tuple[str, str], str] = {
    ("receivers", "otlp"): f"{_CORE}/receiver/otlpreceiver {_RELEASE}",
    ("processors", "memory_limiter"): f"{_CORE}/processor/memorylimiterprocessor {_RELEASE}",
    ("processors", "batch"): f"{_CORE}/processor/batchprocessor {_RELEASE}",
    ("processors", "k8s_attributes"): f"{_CONTRIB}/processor/k8sattributesprocessor v0.160.0",
    ("processors", "resource_detection"): f"{_CONTRIB}/processor/resourcedetectionprocessor v0.158.0",
    ("processors", "resource"): f"{_CONTRIB}/processor/resourceprocessor {_RELEASE}",
    ("exporters", "otlp_grpc"): f"{_CORE}/exporter/otlpexporter {_RELEASE}",
    ("exporters", "otlp_http"): f"{_CORE}/exporter/otlphttpexporter {_RELEASE}",
    ("exporters", "azure_monitor"): f"{_CONTRIB}/exporter/azuremonitorexporter {_RELEASE}",
    ("exporters", "alibabacloud_logservice"): f"{_CONTRIB}/exporter/alibabacloudlogserviceexporter {_RELEASE}",
    ("exporters", "file"): f"{_CONTRIB}/exporter/fileexporter {_RELEASE}",
    ("extensions", "sigv4auth"): f"{_CONTRIB}/extension/sigv4authextension v0.159.0",
    ("extensions", "health_check"): f"{_CONTRIB}/extension/healthcheckextension {_RELEASE}",
}
COLLECTOR_BINARY = "otelcol-mmfleet"


def collector_manifest(output_path: Path) -> dict[str, object]:
    """The builder's configuration (its README's keys): ``dist``, one list per section, providers, telemetry."""
    manifest: dict[str, object] = {
        "dist": {
            "module": "mmfleet.local/otelcol",
            "name": COLLECTOR_BINARY,
            "description": "mmfleet's OpenTelemetry Collector (tests only; clusters run COLLECTOR_IMAGE)",
            "output_path": str(output_path),
            "version": COLLECTOR_VERSION,
        }
    }
    for (section, _), gomod in COLLECTOR_COMPONENTS.items():
        manifest.setdefault(section, []).append({"gomod": gomod})  # type: ignore[attr-defined]
    # env: the configs' ${env:...}; file: --config=<path>.
    manifest["providers"] = [
        {"gomod": f"{_CORE}/confmap/provider/{name}provider {_PROVIDERS_VERSION}"} for name in ("env", "file")
    ]
    manifest["telemetry"] = {
        "gomod": f"{_CORE}/service {_RELEASE}",
        "import": f"{_CORE}/service/telemetry/otelconftelemetry",
    }
    return manifest


def collector_dir(root: Path | None = None) -> Path:
    """``otelcol-v<release>-<manifest hash>``: a changed component list builds into a new directory."""
    text = json.dumps(sorted(COLLECTOR_COMPONENTS.items()), sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return (root or cache_root()) / f"otelcol-v{COLLECTOR_VERSION}-{digest}"


def ensure_collector(progress: Progress = silent) -> Path:
    """The collector binary, built once with the Collector Builder (minutes); instant when cached."""
    root = cache_root()
    final = collector_dir(root)
    binary = final / "bin" / COLLECTOR_BINARY
    _ensure_built(
        root,
        lambda: os.access(binary, os.X_OK),
        "the OpenTelemetry Collector",
        "collector",
        lambda go: _build_collector(final, go, progress),
    )
    return binary


def _build_collector(final: Path, go: str, progress: Progress) -> None:
    build = _Build(final, "otelcol", f"the OpenTelemetry Collector v{COLLECTOR_VERSION}", "~7 min", go, progress)
    runner, workdir = build.runner, build.workdir
    runner.env["GOBIN"] = str(workdir / "bin")
    builder = f"{_CORE}/cmd/builder@{_RELEASE}"
    runner.run("install", builder, note=f"go install {builder}")

    with build.staging() as staging:
        sources = staging / "src"
        manifest = workdir / "builder-config.yaml"
        manifest.write_text(yaml.safe_dump(collector_manifest(sources), sort_keys=False))
        note = f"builder: generate, go mod tidy, go build ({len(COLLECTOR_COMPONENTS)} components; the slow step)"
        runner.run(f"--config={manifest}", program=str(workdir / "bin" / "builder"), note=note)
        os.rename(sources / COLLECTOR_BINARY, staging / "bin" / COLLECTOR_BINARY)
        shutil.rmtree(sources)


# --- Helm ------------------------------------------------------------------------------------------------

_HELM_MODULE = "helm.sh/helm/v3"


def helm_path(root: Path | None = None) -> Path:
    """Where the helm binary is (or will be); nothing is built."""
    return (root or cache_root()) / f"helm-v{HELM_VERSION}" / "bin" / "helm"


_CLIENT_GO = re.compile(r"^\s*k8s\.io/client-go v(\d+)\.(\d+)\.", re.MULTILINE)


def _helm_ldflags(go_mod: str) -> str:
    """The stamps helm's Makefile sets: its version, and the Kubernetes version its client-go stands for (which
    ``helm template``/``lint`` report as ``.Capabilities.KubeVersion`` instead of the compiled-in v1.20)."""
    found = _CLIENT_GO.search(go_mod)
    if found is None:
        raise BuildError(f"no k8s.io/client-go requirement in {_HELM_MODULE}@v{HELM_VERSION}'s go.mod")
    major, minor = str(int(found[1]) + 1), found[2]
    stamps = [f"-X {_HELM_MODULE}/internal/version.version=v{HELM_VERSION}"]
    stamps += [
        f"-X {_HELM_MODULE}/pkg/{pkg}.k8sVersion{part}={value}"
        for pkg in ("lint/rules", "chartutil")
        for part, value in (("Major", major), ("Minor", minor))
    ]
    return "-s -w " + " ".join(stamps)


def ensure_helm(progress: Progress = silent) -> Path:
    """The helm binary, built once from its Go module (about 3 minutes); instant when cached."""
    return _ensure_in_module(
        helm_path(cache_root()),
        _InModule("helm", f"helm v{HELM_VERSION}", "~3 min", _HELM_MODULE, HELM_VERSION, "./cmd/helm"),
        lambda info: _helm_ldflags(Path(info["GoMod"]).read_text()),
        progress,
    )


@dataclass(frozen=True)
class _InModule:
    """A command built inside the (read-only) module the proxy serves: its go.mod and go.sum as released."""

    key: str
    what: str
    estimate: str
    module: str
    version: str
    package: str
    env: tuple[tuple[str, str], ...] = ()


def _ensure_in_module(
    binary: Path, spec: _InModule, ldflags: Callable[[dict[str, Any]], str], progress: Progress
) -> Path:
    """``binary`` (at ``<cache>/<key>-v<version>/bin/``), built once by ``go build`` of ``spec.package`` inside the
    module, with ``ldflags`` from the module's ``go mod download -json`` answer."""

    def build_it(go: str) -> None:
        build = _Build(binary.parent.parent, spec.key, spec.what, spec.estimate, go, progress)
        target = f"{spec.module}@v{spec.version}"
        info = json.loads(build.runner.run("mod", "download", "-json", target, note=f"go mod download {target}"))
        with build.staging() as staging:
            builder = _Runner(go, Path(info["Dir"]), build.log, progress)
            builder.env.update({"GOFLAGS": "-mod=readonly", **dict(spec.env)})
            out = str(staging / "bin" / binary.name)
            flags = ldflags(info)
            builder.run("build", "-trimpath", "-ldflags", flags, "-o", out, spec.package, note=f"go build {spec.key}")

    _ensure_built(cache_root(), lambda: os.access(binary, os.X_OK), spec.what, spec.key, build_it)
    return binary


# --- the endpoint picker ----------------------------------------------------

_EPP_MODULE = "sigs.k8s.io/gateway-api-inference-extension"


def epp_path(root: Path | None = None) -> Path:
    """Where the endpoint picker binary is (or will be); nothing is built."""
    return (root or cache_root()) / f"epp-v{EPP_VERSION}" / "bin" / "epp"


def _epp_ldflags(info: dict[str, Any]) -> str:
    """The stamps its Dockerfile sets, which it logs at startup and exports as ``inference_extension_info``: the
    commit the proxy says the tag is at (the Dockerfile's default ``unknown`` when it does not say), and the tag."""
    commit = info.get("Origin", {}).get("Hash") or "unknown"
    stamps = [f"-X {_EPP_MODULE}/version.CommitSHA={commit}", f"-X {_EPP_MODULE}/version.BuildRef=v{EPP_VERSION}"]
    return "-s -w " + " ".join(stamps)


def ensure_epp(progress: Progress = silent) -> Path:
    """The endpoint picker binary, built once from its Go module (about 2 minutes); instant when cached. Its zip
    keeps a go.work naming ./conformance, which the zip leaves out, so the workspace is off."""
    spec = _InModule("epp", f"the endpoint picker v{EPP_VERSION}", "~2 min", _EPP_MODULE, EPP_VERSION, "./cmd/epp",
                     env=(("GOWORK", "off"),))  # fmt: skip
    return _ensure_in_module(epp_path(cache_root()), spec, _epp_ldflags, progress)


# --- Argo CD ---------------------------------------------------------------------------------------------

ARGOCD_VERSION = "3.5.3"
_ARGOCD_MODULE = "github.com/argoproj/argo-cd/v3"
# Argo CD's go.mod replaces its gitops-engine with ./gitops-engine, a nested module that the module zip leaves out.
# The proxy serves that nested module only at the commits of the v3.5.2 and v3.5.3 tags (pseudo-versions whose
# time is the tag's, as the proxy's .info of each tag says), so v3.5.3: the newest v3.5.7 has nothing to replace it
# with, and every v3.6.x requires go 1.27 (the builds here use the installed go, GOTOOLCHAIN=local).
_GITOPS_ENGINE = "github.com/argoproj/argo-cd/gitops-engine"
_GITOPS_ENGINE_VERSION = "v0.0.0-20260914071520-c9c369efcc5b"
ARGOCD_COMMANDS = ("argocd-application-controller", "argocd-repo-server")
# Argo CD's cmd/main.go picks the component by argv[0] (or ARGOCD_BINARY_NAME) among all eleven; this main keeps
# the two a sync needs, so neither the API server (with the UI), the CLI nor the other controllers are compiled.
_ARGOCD_MAIN = """\
package main

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/util/log"
)

func init() {
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

func main() {
	name := filepath.Base(os.Args[0])
	if val := os.Getenv("ARGOCD_BINARY_NAME"); val != "" {
		name = val
	}
	var command *cobra.Command
	switch name {
	case common.CommandApplicationController:
		command = appcontroller.NewCommand()
	case common.CommandRepoServer:
		command = reposerver.NewCommand()
	default:
		names := common.CommandApplicationController + " or " + common.CommandRepoServer
		os.Stderr.WriteString("run as " + names + "\\n")
		os.Exit(2)
	}
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
"""
_ARGOCD_CRDS = ("application-crd.yaml", "appproject-crd.yaml")
_ARGOCD_CONFIG = ("argocd-cm.yaml", "argocd-rbac-cm.yaml", "argocd-secret.yaml")
# The repo server runs git-verify-wrapper.sh for every manifest it generates (signed or not), from PATH: the
# release's image copies these from hack/ to /usr/local/bin; here they go beside the binary.
_ARGOCD_SCRIPTS = ("git-verify-wrapper.sh", "gpg-wrapper.sh")


@dataclass(frozen=True)
class ArgoCD:
    """The built Argo CD: one binary under two names (``ARGOCD_COMMANDS``) beside the scripts the repo server runs
    (put its directory on the repo server's PATH), and manifests of its release."""

    application_controller: Path
    repo_server: Path
    crds: tuple[Path, ...]  # Application, AppProject (the module's manifests/crds)
    config: tuple[Path, ...]  # argocd-cm, argocd-rbac-cm, argocd-secret as installed (manifests/base/config)


def argocd_at(root: Path | None = None) -> ArgoCD:
    """Where Argo CD is (or will be); nothing is built."""
    final = (root or cache_root()) / f"argocd-v{ARGOCD_VERSION}"
    controller, repo_server = (final / "bin" / name for name in ARGOCD_COMMANDS)
    crds = tuple(final / "crds" / name for name in _ARGOCD_CRDS)
    return ArgoCD(controller, repo_server, crds, tuple(final / "config" / name for name in _ARGOCD_CONFIG))


def _argocd_complete(built: ArgoCD) -> bool:
    scripts = [built.repo_server.parent / name for name in _ARGOCD_SCRIPTS]
    executables = [built.application_controller, built.repo_server, *scripts]
    return all(os.access(e, os.X_OK) for e in executables) and all(m.exists() for m in (*built.crds, *built.config))


def ensure_argocd(progress: Progress = silent) -> ArgoCD:
    """Argo CD's application controller and repo server, built once from its Go module (minutes); then instant."""
    root = cache_root()
    built = argocd_at(root)
    _ensure_built(
        root,
        lambda: _argocd_complete(built),
        "Argo CD",
        "argocd",
        lambda go: _build_argocd(built.repo_server.parent.parent, go, progress),
    )
    return built


def _writable_copy(source: Path, target: Path) -> None:
    """Copy a (read-only) module from the module cache to a directory go may write go.mod, go.sum and a main into."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("docs", "ui", "test"))
    for directory, _, files in os.walk(target):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)


def _build_argocd(final: Path, go: str, progress: Progress) -> None:
    build = _Build(final, "argocd", f"Argo CD v{ARGOCD_VERSION}", "~8 min", go, progress)
    target = f"{_ARGOCD_MODULE}@v{ARGOCD_VERSION}"
    info = json.loads(build.runner.run("mod", "download", "-json", target, note=f"go mod download {target}"))
    module = build.workdir / "module"
    _writable_copy(Path(info["Dir"]), module)
    (module / "cmd" / "mmfleet-argocd").mkdir()
    (module / "cmd" / "mmfleet-argocd" / "main.go").write_text(_ARGOCD_MAIN)
    try:
        with build.staging() as staging:
            (staging / "crds").mkdir()
            (staging / "config").mkdir()
            builder = _Runner(go, module, build.log, progress)
            replace = f"{_GITOPS_ENGINE}={_GITOPS_ENGINE}@{_GITOPS_ENGINE_VERSION}"
            builder.run("mod", "edit", f"-replace={replace}", note=f"go mod edit -replace={replace}")
            version = f"{_ARGOCD_MODULE}/common"
            stamps = f"-X {version}.version={ARGOCD_VERSION} -X {version}.gitTag=v{ARGOCD_VERSION}"
            out = staging / "bin" / "argocd"
            args = ("build", "-trimpath", "-ldflags", f"-s -w {stamps}", "-o", str(out), "./cmd/mmfleet-argocd")
            builder.run(*args, note="go build the application controller and the repo server (the slow step)")
            for name in ARGOCD_COMMANDS:  # the component is chosen by argv[0]
                (staging / "bin" / name).symlink_to("argocd")
            for name in _ARGOCD_SCRIPTS:
                shutil.copyfile(module / "hack" / name, staging / "bin" / name)
                os.chmod(staging / "bin" / name, 0o755)
            for name in _ARGOCD_CRDS:
                shutil.copyfile(module / "manifests" / "crds" / name, staging / "crds" / name)
            for name in _ARGOCD_CONFIG:
                shutil.copyfile(module / "manifests" / "base" / "config" / name, staging / "config" / name)
    finally:
        shutil.rmtree(module, ignore_errors=True)


# --- the inference simulator and the gateway stand-in ----------------------------------------------------

_INFERENCE_SIM_MODULE = "github.com/llm-d/llm-d-inference-sim"


def inference_sim_path(root: Path | None = None) -> Path:
    """Where the inference simulator binary is (or will be); nothing is built."""
    return (root or cache_root()) / f"inference-sim-v{INFERENCE_SIM_VERSION}" / "bin" / "llm-d-inference-sim"


def ensure_inference_sim(progress: Progress = silent) -> Path:
    """The llm-d inference simulator, built once from its Go module (about 3 minutes); instant when cached. Its
    Makefile stamps nothing (``CGO_ENABLED=0 go build``, Makefile:75)."""
    spec = _InModule("inference-sim", f"the llm-d inference simulator v{INFERENCE_SIM_VERSION}", "~3 min",
                     _INFERENCE_SIM_MODULE, INFERENCE_SIM_VERSION, "./cmd/llm-d-inference-sim")  # fmt: skip
    return _ensure_in_module(inference_sim_path(cache_root()), spec, lambda _: "-s -w", progress)


GATEWAY_STANDIN = "gateway-standin"
_STANDIN_FILES = ("go.mod", "go.sum", "main.go")


def gateway_standin_source() -> Path:
    """The stand-in's Go module, shipped in the lab's package."""
    return Path(str(resources.files("mmfleet_lab") / "gateway" / "standin"))


def gateway_standin_path(root: Path | None = None) -> Path:
    """Where the stand-in built from the current source is (or will be): ``gateway-standin-<source hash>``, so an
    edit builds anew; nothing is built."""
    digest = hashlib.sha256()
    for name in _STANDIN_FILES:
        digest.update(name.encode() + b"\0" + (gateway_standin_source() / name).read_bytes() + b"\0")
    return (root or cache_root()) / f"{GATEWAY_STANDIN}-{digest.hexdigest()[:12]}" / "bin" / GATEWAY_STANDIN


def ensure_gateway_standin(progress: Progress = silent) -> Path:
    """The gateway stand-in (Envoy's part in front of an InferencePool, for tests), built from its source with the
    committed go.sum (``-mod=readonly``: a dependency it does not pin fails the build); seconds once its modules are
    downloaded, instant when cached."""
    binary = gateway_standin_path(cache_root())

    def build_it(go: str) -> None:
        build = _Build(binary.parent.parent, GATEWAY_STANDIN, "the gateway stand-in", "~1 min", go, progress)
        with build.staging() as staging:
            builder = _Runner(go, gateway_standin_source(), build.log, progress)
            builder.env["GOFLAGS"] = "-mod=readonly"
            out = str(staging / "bin" / GATEWAY_STANDIN)
            builder.run("build", "-trimpath", "-ldflags", "-s -w", "-o", out, ".", note="go build gateway-standin")

    _ensure_built(cache_root(), lambda: os.access(binary, os.X_OK), "the gateway stand-in", GATEWAY_STANDIN, build_it)
    return binary
