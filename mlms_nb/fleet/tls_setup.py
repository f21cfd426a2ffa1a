"""``mlms scheduler --tls-setup DIR``: a CA and a certificate it signs, made with the ``openssl`` command, so that a
fleet secured with Dask's TLS is one step. Files already in ``DIR`` are reused (an agent started earlier keeps
working); ``ca.key`` stays in ``DIR`` and should not be copied to the agents."""
from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from mlms_nb.errors import MlmsError

DAYS = 825
FILES = ("ca.pem", "node.pem", "node.key")


def tls_files(folder: Path) -> dict[str, str]:
    """The TLS options (``tls_ca_file``, ``tls_cert``, ``tls_key``) of the files in ``folder``."""
    return dict(zip(("tls_ca_file", "tls_cert", "tls_key"), (str(folder / name) for name in FILES)))


def _names(host: str | None) -> str:
    """subjectAltName for this machine: localhost, 127.0.0.1, its host names and ``host`` when it is one."""
    names = {"DNS:localhost", "IP:127.0.0.1", f"DNS:{socket.gethostname()}", f"DNS:{socket.getfqdn()}"}
    if host and host not in ("0.0.0.0", "::", ""):
        names.add(f"IP:{host}" if host.replace(".", "").isdigit() or ":" in host else f"DNS:{host}")
    return ",".join(sorted(names))


def make_certificates(folder: str | Path, host: str | None = None) -> dict[str, str]:
    """A CA (``ca.pem``, ``ca.key``) and a certificate it signs (``node.pem``, ``node.key``) in ``folder``, made
    unless they are there already; returns the TLS options that use them. Keys are readable by their owner only."""
    folder = Path(folder).expanduser().resolve()
    if all((folder / name).is_file() for name in FILES):
        return tls_files(folder)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise MlmsError("--tls-setup makes certificates with the openssl command, which is not installed here: install "
                        "openssl (e.g. apt-get install openssl), or make them as docs/agents.md shows")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    (folder / "san.ext").write_text(f"subjectAltName={_names(host)}\n")
    steps = (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", str(DAYS),
              "-subj", "/CN=mlms CA"],
             ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj",
              f"/CN={socket.gethostname()}"],
             ["x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
              "node.pem", "-days", str(DAYS), "-extfile", "san.ext"])
    for args in steps:
        done = subprocess.run([openssl, *args], cwd=folder, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise MlmsError(f"--tls-setup: `openssl {args[0]}` failed in {folder} ({last[:200]})")
    for key in ("ca.key", "node.key"):
        (folder / key).chmod(0o600)
    return tls_files(folder)
