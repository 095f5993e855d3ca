"""A real Kubernetes API server for custom resources, with KubeRay's CRDs, for tests: the
standalone apiextensions-apiserver (k8s.io/apiextensions-apiserver 0.36, the generic API
server machinery — storage in etcd, resourceVersion, watch, paging, structural-schema
validation, the status subresource, field validation) and etcd 3.5, from Debian unstable's
packages in a chroot.

The chroot is tools/kube-apiextensions-chroot's, built once per machine from Debian's package
registry (``.ci/run`` builds it) and only read here: each server lays its files out in a
directory of its own under the chroot's /tmp and takes free ports, so two runs never share
one. What the standalone server needs that a cluster's kube-apiserver would give it, each
found by running it:

- TLS and client certificates: it authenticates by ``--client-ca-file`` (x509) only, since
  token review and SubjectAccessReview are delegated to a kube-apiserver it does not have;
  a client certificate in group system:masters is authorized by its default
  ``--authorization-always-allow-groups``. The tests' client is such a certificate, in a
  kubeconfig, as an operator's admin context is.
- A kubeconfig for its core-API informers and delegated authn/z (required flags): its own
  address, with the same certificate. Those informers never sync (it serves no core API),
  so the admission plugins that wait for them (NamespaceLifecycle and the webhook and
  policy ones) are off; no cluster's namespaces exist here, and any namespace takes objects.
- After a restart it serves a CRD's objects only once it has read the CRDs again: until
  then a RayJob's path answers 404 "the server could not find the requested resource",
  with no name in its Status.
"""

import base64
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CHROOT = Path(os.environ.get("TUNEPLANE_KUBE_ROOT", "/var/cache/tuneplane/kube-apiextensions"))
# tools/kube-apiextensions-chroot writes it last: a chroot without it is half built.
COMPLETE = ".tuneplane-complete"
BUILD = "apt-get install debootstrap && tools/kube-apiextensions-chroot"
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
# Run a daemon in the chroot, in a mount namespace of its own with /proc: $0 the chroot.
IN_CHROOT = 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
APISERVER = "/usr/local/bin/apiextensions-apiserver"
ETCD = "/usr/bin/etcd"
CRDS = Path(__file__).parent / "kube"
START_TIMEOUT = 60.0
STOP_GRACE = 10.0
# The admission plugins that wait for core-API informers this server never syncs.
ADMISSION_OFF = (
    "NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
    "ValidatingAdmissionPolicy,MutatingAdmissionPolicy"
)
CONTEXT = "tuneplane-test"


class KubeStartupError(RuntimeError):
    pass


def kube_available(root: Path = CHROOT) -> bool:
    """Whether the chroot is built and this machine has what enters it."""
    return (root / COMPLETE).is_file() and all(
        shutil.which(name, path=SEARCH_PATH) for name in ("unshare", "chroot")
    )


def versions(root: Path = CHROOT) -> dict[str, str]:
    """The Debian packages the chroot was built from, by name (the tool writes them)."""
    lines = (root / ".tuneplane-versions").read_text().splitlines()
    return dict(line.split("\t", 1) for line in lines if "\t" in line)


def rayjob_crd() -> dict:
    """The project's RayJob CRD (tests/kube/rayjobs.ray.io.yaml), its pod templates filled
    in from podtemplate.yaml."""
    crd = yaml.safe_load((CRDS / "rayjobs.ray.io.yaml").read_text())
    template = yaml.safe_load((CRDS / "podtemplate.yaml").read_text())

    def fill(node):
        if isinstance(node, dict):
            if node == {"$ref": "podTemplate"}:
                return template
            return {key: fill(value) for key, value in node.items()}
        if isinstance(node, list):
            return [fill(item) for item in node]
        return node

    return fill(crd)


class KubeApiServer:
    """etcd and the apiextensions-apiserver in the chroot at ``root``, on free loopback ports,
    with the RayJob CRD established. ``kubeconfig`` (a file) and ``CONTEXT`` reach it."""

    def __init__(self, root: Path = CHROOT):
        self.root = Path(root).resolve()
        self.scratch = Path(tempfile.mkdtemp(prefix="tuneplane-kube-", dir=self.root / "tmp"))
        self.etcd_port, self.peer_port, self.port = _free_ports(3)
        self.kubeconfig = self.scratch / "kubeconfig"
        self._etcd: subprocess.Popen | None = None
        self._apiserver: subprocess.Popen | None = None
        self._served: list[str] = []  # the CRDs' paths, once applied

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def inside(self) -> Path:
        """The scratch dir as the chroot's processes see it."""
        return Path("/") / self.scratch.relative_to(self.root)

    def __enter__(self) -> "KubeApiServer":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        self._write_certificates()
        self._start_etcd()
        self.start_apiserver()
        self.apply_crd(rayjob_crd())

    def stop(self) -> None:
        self.stop_apiserver()
        if self._etcd is not None:
            _terminate(self._etcd)
            self._etcd = None

    # The API server

    def start_apiserver(self) -> None:
        s = self.inside
        argv = [
            APISERVER,
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={s}/server.crt",
            f"--tls-private-key-file={s}/server.key",
            f"--client-ca-file={s}/ca.crt",
            f"--kubeconfig={s}/self.kubeconfig",
            f"--authentication-kubeconfig={s}/self.kubeconfig",
            f"--authorization-kubeconfig={s}/self.kubeconfig",
            "--authentication-skip-lookup",
            f"--disable-admission-plugins={ADMISSION_OFF}",
            f"--cert-dir={s}/certs",
            "-v=1",
        ]
        self._apiserver = self._spawn("apiserver", argv)
        self._wait_for("the API server", self._healthy, "apiserver")
        if self._served:  # a restart: until its storage is ready again, 404s and 429s
            self._wait_for("RayJobs to be served again", self._serves_all, "apiserver")

    def _serves_all(self) -> bool:
        """Each CRD's objects listed both from etcd (a page) and from the watch cache (a
        whole list), which answers 429 "storage is (re)initializing" until it has loaded."""
        return all(
            self.request("GET", f"{path}{query}")[0] == 200
            for path in self._served
            for query in ("?limit=1", "", "?labelSelector=a%3Db&limit=500")
        )

    def stop_apiserver(self) -> None:
        if self._apiserver is not None:
            _terminate(self._apiserver)
            self._apiserver = None

    def restart_apiserver(self) -> None:
        self.stop_apiserver()
        self.start_apiserver()

    def kill_apiserver(self) -> None:
        """As a crash: SIGKILL, no graceful shutdown."""
        if self._apiserver is not None:
            self._apiserver.kill()
            self._apiserver.wait()
            self._apiserver = None

    def request(self, method: str, path: str, body=None, content_type="application/json"):
        """One request with the tests' admin certificate; the decoded answer and status."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", content_type)
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=10) as answer:
                return answer.status, _decoded(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, _decoded(error.read())

    def apply_crd(self, crd: dict) -> None:
        """Create (or replace) a CRD and wait until the server serves its objects."""
        name = crd["metadata"]["name"]
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        status, body = self.request("POST", path, crd)
        if status == 409:
            _, current = self.request("GET", f"{path}/{name}")
            crd = {**crd, "metadata": {**crd["metadata"], **current["metadata"]}}
            status, body = self.request("PUT", f"{path}/{name}", crd)
        if status not in (200, 201):
            raise KubeStartupError(f"CRD {name} refused: {status} {body}")
        self._wait_for("the CRD to be established", lambda: self.crd_established(name))
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        version = crd["spec"]["versions"][0]["name"]
        self._wait_for(
            f"{plural} to be served",
            lambda: self.request("GET", f"/apis/{group}/{version}/{plural}?limit=1")[0] == 200,
        )
        self._served.append(f"/apis/{group}/{version}/{plural}")

    def crd_established(self, name: str) -> bool:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        status, body = self.request("GET", path)
        conditions = ((body or {}).get("status") or {}).get("conditions") if status == 200 else []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions or [])

    # etcd

    def etcd(self, method: str, body: dict) -> dict:
        """etcd's v3 JSON gateway: ``method`` e.g. "kv/range", "kv/compaction"."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.etcd_port}/v3/{method}",
            data=json.dumps(body).encode(),
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as answer:
            return json.loads(answer.read())

    def compact(self) -> int:
        """Compact etcd's history up to its current revision, as the API server does every
        5 minutes (``--etcd-compaction-interval``); the revision compacted to."""
        key = base64.b64encode(b"/").decode()
        revision = int(self.etcd("kv/range", {"key": key, "limit": 1})["header"]["revision"])
        self.etcd("kv/compaction", {"revision": revision, "physical": True})
        return revision

    # Laying out and running

    def _write_certificates(self) -> None:
        """A CA, the server's certificate for 127.0.0.1, and an admin client certificate
        (group system:masters) in a kubeconfig for the tests and one for the server."""
        ca_key, ca = _certificate("tuneplane-test-ca", ca=True)
        server_key, server = _certificate(
            "127.0.0.1", issuer=(ca_key, ca), server_names=("localhost", "127.0.0.1")
        )
        client_key, client = _certificate(
            "tuneplane-test-admin", issuer=(ca_key, ca), groups=("system:masters",)
        )
        self._files = {
            "ca.crt": _pem(ca),
            "server.crt": _pem(server),
            "server.key": _pem(server_key),
            "client.crt": _pem(client),
            "client.key": _pem(client_key),
        }
        for name, data in self._files.items():
            path = self.scratch / name
            path.write_bytes(data)
            path.chmod(0o600)
        for name in ("kubeconfig", "self.kubeconfig"):
            (self.scratch / name).write_text(yaml.safe_dump(self.kubeconfig_dict()))

    def kubeconfig_dict(self, context: str = CONTEXT) -> dict:
        data = {name: base64.b64encode(self._files[name]).decode() for name in self._files}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": context,
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": data["ca.crt"],
                    },
                }
            ],
            "users": [
                {
                    "name": context,
                    "user": {
                        "client-certificate-data": data["client.crt"],
                        "client-key-data": data["client.key"],
                    },
                }
            ],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            "current-context": context,
        }

    def _ssl(self):
        import ssl

        context = ssl.create_default_context(cafile=str(self.scratch / "ca.crt"))
        context.load_cert_chain(self.scratch / "client.crt", self.scratch / "client.key")
        return context

    def _start_etcd(self) -> None:
        s = self.inside
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [
            ETCD,
            "--name=tuneplane-test",
            f"--data-dir={s}/etcd",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=tuneplane-test={peer}",
            "--log-level=warn",
            "--unsafe-no-fsync",  # a test's data dies with it
        ]
        self._etcd = self._spawn("etcd", argv)
        self._wait_for("etcd", self._etcd_healthy, "etcd")

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        if not (self.root / argv[0].lstrip("/")).exists():
            raise KubeStartupError(
                f"{argv[0]} is missing from {self.root}: rebuild it with {BUILD}"
            )
        log = open(self.scratch / f"{name}.log", "ab")  # noqa: SIM115 -- the process's
        unshare = ["unshare", "--mount", "--propagation", "private", "--"]
        try:
            return subprocess.Popen(
                [*unshare, "sh", "-c", IN_CHROOT, str(self.root), *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def _healthy(self) -> bool:
        try:
            return self.request("GET", "/readyz?exclude=informer-sync")[0] == 200
        except OSError:
            return False

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.etcd_port}/health", timeout=2
            ) as answer:
                return json.loads(answer.read()).get("health") == "true"
        except OSError:
            return False

    def _wait_for(self, what: str, ready, *logs: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for name, process in (("etcd", self._etcd), ("apiserver", self._apiserver)):
                if name in logs and process is not None and process.poll() is not None:
                    raise KubeStartupError(f"{name} exited: {self._tail(name)}")
            if ready():
                return
            time.sleep(0.1)
        raise KubeStartupError(
            f"waited {START_TIMEOUT:.0f} s for {what}: "
            + " | ".join(self._tail(name) for name in logs)
        )

    def _tail(self, name: str, lines: int = 20) -> str:
        path = self.scratch / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _decoded(body: bytes):
    """JSON, or the text of a health check's answer."""
    try:
        return json.loads(body or b"null")
    except ValueError:
        return body.decode(errors="replace")


def _certificate(name, issuer=None, ca=False, server_names=(), groups=()):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    subject += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
    subject = x509.Name(subject)
    issuer_key, issuer_cert = issuer or (key, None)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server_names:
        sans = [
            x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n)
            for n in server_names
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if not ca:
        usage = x509.ExtendedKeyUsageOID.SERVER_AUTH if server_names else None
        usage = usage or x509.ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return key, builder.sign(issuer_key, hashes.SHA256())


def _pem(thing) -> bytes:
    if isinstance(thing, x509.Certificate):
        return thing.public_bytes(serialization.Encoding.PEM)
    return thing.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _terminate(process: subprocess.Popen) -> None:
    """TERM to the process's session (sh, chroot, the daemon), KILL after STOP_GRACE."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
