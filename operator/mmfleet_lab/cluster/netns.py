"""Network namespaces for servers that cannot be told where to listen: the endpoint picker and the inference
simulator bind every interface (no bind-address flag: EPP v1.5.0 ``cmd/epp/runner/runner.go:275``, the simulator's
``--port`` only, ``pkg/common/parser.go:115``), and the lab's servers listen on 127.0.0.1 only. So each runs in a
namespace of its own, where its interfaces are private (needs root and iproute2):

- a *gateway* namespace holding the picker and the gateway stand-in, with a bridge carrying one address of the pod
  network (``POD_CIDR``, where kwok hands out pod IPs: ``pod_controller.go`` ``markPodIP`` takes the node's podCIDR
  or kwok's ``--cidr``);
- one namespace per model-server pod, holding the pod's IP (the one kwok put in its status) on a veth whose other end
  is on the bridge, so the picker reaches ``<pod IP>:<port>`` as it would in a cluster;
- ``forward_tcp``: a port on 127.0.0.1 inside the gateway namespace that leads to the same port on the host's
  127.0.0.1 (the API server), so the cluster's kubeconfig works there unchanged, TLS end to end.

Nothing listens on the host's interfaces; ``isolated_network`` removes every namespace (with its links) and ends every
process it started, also when the block fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from mmfleet_lab.cluster.cluster import POD_CIDR

_CLONE_NEWNET = 0x40000000  # <sched.h>; os.setns arrives in Python 3.12
_NETNS_DIR = Path("/run/netns")  # where ``ip netns add`` mounts a named namespace
BRIDGE = "br0"


class NetnsError(RuntimeError):
    """A namespace, link or address could not be set up; the message names the ``ip`` command and its error."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise NetnsError(f"'ip {' '.join(args)}' failed (exit {done.returncode}): {done.stderr.strip()}")


def socket_in(netns: str, family: int = socket.AF_INET) -> socket.socket:
    """A TCP socket of namespace ``netns`` (a socket stays in the namespace it was made in): made by a thread that
    enters it, since ``setns`` moves only the calling thread."""
    made: list[socket.socket | BaseException] = []

    def make() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(_NETNS_DIR / netns, os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                error = ctypes.get_errno()
                made.append(OSError(error, f"setns into {netns}: {os.strerror(error)}"))
                return
            made.append(socket.socket(family, socket.SOCK_STREAM))
        finally:
            os.close(fd)

    thread = threading.Thread(target=make, name=f"setns-{netns}")
    thread.start()
    thread.join()
    result = made[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class Network:
    """The namespaces of one ``isolated_network``: the gateway's, and one per pod IP added."""

    def __init__(self, tag: str, cidr: str) -> None:
        self.gateway = f"mmf-{tag}-gw"
        self.network = ipaddress.ip_network(cidr)
        self.pods: dict[str, str] = {}  # pod IP -> its namespace
        self.processes: list[subprocess.Popen[bytes]] = []
        self.listeners: list[socket.socket] = []
        self._tag = tag
        self._count = 0

    def start(self) -> None:
        bridge_ip = f"{self.network[-2]}/{self.network.prefixlen}"  # the pod network's last host address
        _ip("netns", "add", self.gateway)
        _ip("-n", self.gateway, "link", "set", "lo", "up")
        _ip("-n", self.gateway, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", self.gateway, "addr", "add", bridge_ip, "dev", BRIDGE)
        _ip("-n", self.gateway, "link", "set", BRIDGE, "up")

    def add_pod(self, ip: str) -> str:
        """A namespace holding ``ip`` (a pod IP in the pod network) on a link to the gateway's bridge; its name."""
        if ipaddress.ip_address(ip) not in self.network:
            raise NetnsError(f"pod IP {ip} is outside the pod network {self.network}")
        if ip in self.pods:
            raise NetnsError(f"pod IP {ip} already has a namespace ({self.pods[ip]})")
        self._count += 1
        netns, veth = f"mmf-{self._tag}-p{self._count}", f"veth{self._count}"
        _ip("netns", "add", netns)
        self.pods[ip] = netns
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", self.gateway, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("-n", self.gateway, "link", "set", veth, "master", BRIDGE, "up")
        _ip("-n", netns, "addr", "add", f"{ip}/{self.network.prefixlen}", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        return netns

    def reach_from_host(self) -> None:
        """A link from the host to the gateway's bridge, holding one more address of the pod network: the host then
        reaches ``<pod IP>:<port>`` as a cluster's nodes and the operator's pod do (the operator wakes and puts to
        sleep warm-standby pods at their IPs). It goes with the gateway namespace; nothing listens on it."""
        host, peer = f"mmf-{self._tag}-h", f"mmf-{self._tag}-hb"
        _ip("link", "add", host, "type", "veth", "peer", "name", peer, "netns", self.gateway)
        _ip("-n", self.gateway, "link", "set", peer, "master", BRIDGE, "up")
        _ip("addr", "add", f"{self.network[-3]}/{self.network.prefixlen}", "dev", host)
        _ip("link", "set", host, "up")

    def run(
        self, netns: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """``argv`` in namespace ``netns`` (``ip netns exec`` execs it, so the process is the command), its output
        appended to ``log``; ended with the network."""
        with log.open("ab") as out:
            process = subprocess.Popen(
                ["ip", "netns", "exec", netns, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def forward_tcp(self, port: int) -> None:
        """127.0.0.1:``port`` in the gateway namespace leads to 127.0.0.1:``port`` of the host (this process's)."""
        listener = socket_in(self.gateway)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        self.listeners.append(listener)

        def accept() -> None:
            with contextlib.suppress(OSError):  # the listener closed: the network is going
                while True:
                    inside, _ = listener.accept()
                    try:
                        outside = socket.create_connection(("127.0.0.1", port), timeout=10)
                    except OSError:
                        inside.close()
                        continue
                    outside.settimeout(None)
                    for source, sink in ((inside, outside), (outside, inside)):
                        threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

        threading.Thread(target=accept, name=f"forward-{port}", daemon=True).start()

    @staticmethod
    def stop(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
        """SIGTERM to the process's group (each started in a session of its own), SIGKILL after ``grace``."""
        if process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def close(self) -> None:
        """Every process ended, every listener closed, every namespace deleted (their links go with them); the
        first failure raised after all were tried."""
        failures: list[BaseException] = []
        for process in self.processes:
            try:
                self.stop(process)
            except (OSError, subprocess.SubprocessError) as error:
                failures.append(error)
        for listener in self.listeners:
            listener.close()
        for netns in [*self.pods.values(), self.gateway]:
            if (_NETNS_DIR / netns).exists():
                try:
                    _ip("netns", "del", netns)
                except NetnsError as error:
                    failures.append(error)
        if failures:
            raise failures[0]


@contextlib.contextmanager
def isolated_network(cidr: str = POD_CIDR) -> Iterator[Network]:
    """A gateway namespace with its bridge in the pod network ``cidr``; everything removed at the end."""
    network = Network(uuid.uuid4().hex[:6], cidr)
    try:
        network.start()
        yield network
    finally:
        network.close()
