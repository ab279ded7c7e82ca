"""PKI for the dev cluster: a CA, the API server's serving cert, client certs and the SA key pair.

Everything is generated with the ``cryptography`` package into the cluster's data directory each
time a cluster starts (a few hundred milliseconds with EC keys); nothing is reused between clusters.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class CertPair:
    """PEM files of one certificate and its private key."""

    cert: Path
    key: Path

    @classmethod
    def write(cls, directory: Path, stem: str, cert: x509.Certificate, key: PrivateKey) -> CertPair:
        """Write both as PEM files ``<stem>.crt`` and ``<stem>.key`` (the key owner-only) in ``directory``."""
        pair = cls(directory / f"{stem}.crt", directory / f"{stem}.key")
        _write_cert(cert, pair.cert)
        _write_key(key, pair.key)
        return pair


@dataclass(frozen=True)
class ClusterPKI:
    """Every file the components need."""

    ca: CertPair
    apiserver: CertPair
    sa_key: Path
    """Service-account token signing key (RSA, PKCS#8 PEM)."""
    sa_pub: Path
    clients: dict[str, CertPair]
    """Client certs by name: admin, scheduler, controller-manager, kwok, front-proxy-client."""


CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("kubernetes-admin", "system:masters"),
    "scheduler": ("system:kube-scheduler", None),
    "controller-manager": ("system:kube-controller-manager", None),
    "kwok": ("kwok-controller", "system:masters"),
    "front-proxy-client": ("front-proxy-client", None),
}
"""Client cert subject per component: (CN = user, O = group). The bootstrap RBAC roles of the
scheduler and controller-manager are bound to these user names."""


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _write_key(key: PrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _sign(
    subject: x509.Name,
    key: PrivateKey,
    issuer: x509.Name,
    issuer_key: PrivateKey,
    *,
    ca: bool = False,
    usages: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate(directory: Path, service_ip: str = "10.0.0.1") -> ClusterPKI:
    """Write a fresh PKI into ``directory`` and return the paths.

    The API server cert is valid for 127.0.0.1, localhost, the first service IP (the in-cluster
    ``kubernetes`` Service) and the usual ``kubernetes.default.svc`` names.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _ec_key()
    ca_name = _name("gpuscaler-dev-cluster-ca")
    ca_cert = _sign(ca_name, ca_key, ca_name, ca_key, ca=True)
    ca = CertPair.write(directory, "ca", ca_cert, ca_key)

    server_key = _ec_key()
    sans: list[x509.GeneralName] = [
        x509.DNSName(n)
        for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                  "kubernetes.default.svc.cluster.local")
    ]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", service_ip)]
    server_cert = _sign(
        _name("kube-apiserver"), server_key, ca_name, ca_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans,
    )
    apiserver = CertPair.write(directory, "apiserver", server_cert, server_key)

    clients: dict[str, CertPair] = {}
    for name, (cn, org) in CLIENTS.items():
        key = _ec_key()
        cert = _sign(_name(cn, org), key, ca_name, ca_key, usages=[ExtendedKeyUsageOID.CLIENT_AUTH])
        clients[name] = CertPair.write(directory, name, cert, key)

    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_key, sa_pub = directory / "sa.key", directory / "sa.pub"
    _write_key(sa, sa_key)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    sa_pub.write_bytes(sa.public_key().public_bytes(serialization.Encoding.PEM, spki))
    return ClusterPKI(ca=ca, apiserver=apiserver, sa_key=sa_key, sa_pub=sa_pub, clients=clients)


def webhook_serving_cert(directory: Path, ca: CertPair, name: str) -> CertPair:
    """A serving cert for a webhook server on 127.0.0.1, signed by the cluster CA ``ca``.

    Written as ``tls.crt`` / ``tls.key`` in ``directory`` (the names controller-runtime's webhook
    server reads from its cert dir); the API server trusts it through the CA in each webhook
    configuration's ``caBundle``.

    Args:
        directory: where the pair goes (created if missing).
        ca: the cluster CA (:attr:`ClusterPKI.ca`).
        name: the certificate's common name (the add-on's name).

    Returns:
        The cert and key files.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise TypeError(f"{ca.key}: the CA key is neither EC nor RSA")
    key = _ec_key()
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = _sign(
        _name(name), key, ca_cert.subject, ca_key, usages=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans
    )
    return CertPair.write(directory, "tls", cert, key)
