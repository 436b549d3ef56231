"""Certificates and keys for the local control plane, made with ``cryptography`` (no openssl CLI).

One CA signs everything: the serving certificate (used by kube-apiserver, and by
kube-controller-manager and kube-scheduler for their health/metrics ports, all on 127.0.0.1), and
client certificates for the admin (``O=system:masters``), for the controller manager and the
scheduler under the user names the bootstrap RBAC policy already grants (as kubeadm does), and
for the API server's front proxy (request-header authentication). The
service-account signing key is separate so tokens are not signed with a TLS key. kube-controller-manager
also signs CSRs with the CA. ECDSA P-256 keys: fast to make and accepted by every component.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVING_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
# 127.0.0.1 is where everything listens; 10.96.0.1 is the ClusterIP of the ``kubernetes`` Service.
SERVING_IPS = ("127.0.0.1", "10.96.0.1")
_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Paths of every PEM file; ``clients`` maps a component name to its client certificate."""

    ca: CertPair
    serving: CertPair
    clients: dict[str, CertPair]
    sa_key: Path
    sa_pub: Path

    @property
    def admin(self) -> CertPair:
        return self.clients["admin"]


# component -> (CommonName = user name, Organizations = groups)
CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("mmfleet-admin", ("system:masters",)),
    "kube-controller-manager": ("system:kube-controller-manager", ()),
    "kube-scheduler": ("system:kube-scheduler", ()),
    # The API server's client cert towards aggregated API servers (metrics adapters); kcm and the scheduler
    # read the request-header CA it implies from the extension-apiserver-authentication ConfigMap.
    "front-proxy": ("front-proxy-client", ()),
}


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path.write_bytes(pem)
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))  # tolerate clock skew between writer and readers
        .not_valid_after(now + _VALIDITY)
    )


def _key_usage(**granted: bool) -> x509.KeyUsage:
    """A KeyUsage with only the named usages on (x509.KeyUsage wants all nine spelled out)."""
    names = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
             "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")  # fmt: skip
    return x509.KeyUsage(**{name: granted.get(name, False) for name in names})


def write_pki(directory: Path) -> Pki:
    """Create a fresh CA, serving and client certificates and the service-account key in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("mmfleet-local-ca")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            _key_usage(digital_signature=True, key_cert_sign=True, crl_sign=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca = CertPair(directory / "ca.crt", directory / "ca.key")
    _write_cert(ca_cert, ca.cert)
    _write_key(ca_key, ca.key)

    def issue(stem: str, subject: x509.Name, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]) -> CertPair:
        key = _key()
        builder = (
            _builder(subject, ca_name, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                _key_usage(digital_signature=True),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        pair = CertPair(directory / f"{stem}.crt", directory / f"{stem}.key")
        _write_cert(builder.sign(ca_key, hashes.SHA256()), pair.cert)
        _write_key(key, pair.key)
        return pair

    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in SERVING_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in SERVING_IPS]
    serving = issue("serving", _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, sans)
    clients = {
        component: issue(component, _name(cn, orgs), ExtendedKeyUsageOID.CLIENT_AUTH, [])
        for component, (cn, orgs) in CLIENTS.items()
    }

    sa_key = _key()
    sa_key_path, sa_pub_path = directory / "sa.key", directory / "sa.pub"
    _write_key(sa_key, sa_key_path)
    sa_pub_path.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return Pki(ca=ca, serving=serving, clients=clients, sa_key=sa_key_path, sa_pub=sa_pub_path)
