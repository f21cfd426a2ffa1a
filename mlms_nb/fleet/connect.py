"""Connections to a Dask scheduler, with Dask's TLS security when certificates are given.

``tls`` is ``{"tls_ca_file", "tls_cert", "tls_key"}`` (file paths; the options ``--tls-ca-file``, ``--tls-cert``,
``--tls-key``): each side proves who it is with its certificate and key, signed by the CA every side trusts, and
every connection is encrypted (``distributed.security.Security`` with ``require_encryption``). Addresses then start
with ``tls://``. A client is made once per address and security and reused (a notebook evaluating ten times opens
one connection).
"""
from __future__ import annotations

import threading

from mlms_nb._optional import require
from mlms_nb.errors import MlmsError

CONNECT_TIMEOUT_S = 10.0
_clients: dict[tuple, object] = {}
_lock = threading.Lock()


class AgentsError(MlmsError):
    """No scheduler at the address, no agent that matches, or an agent run that failed; one sentence."""


def security_for(tls: dict, role: str):  # noqa: ANN201 - distributed.Security
    """Dask's Security for ``role`` (client | scheduler | worker) from the TLS options; no TLS when none is given."""
    distributed_security = require("distributed.security", "agents")
    ca, cert, key = (tls.get(k) for k in ("tls_ca_file", "tls_cert", "tls_key"))
    if not any((ca, cert, key)):
        return distributed_security.Security()
    if not (ca and cert):
        raise AgentsError("TLS needs the CA certificate (--tls-ca-file) and this side's certificate (--tls-cert; "
                          "--tls-key when the key is in a file of its own)")
    return distributed_security.Security(**{"tls_ca_file": ca, f"tls_{role}_cert": cert, f"tls_{role}_key": key,
                                            "require_encryption": True})


def require_tls_files(address: str, tls: dict, who: str = "mlms") -> None:
    """A ``tls://`` address needs certificate files: say so in one sentence (`AgentsError`) before connecting."""
    if str(address).startswith("tls://") and not any(tls.values()):
        raise AgentsError(f"{who}: {address} is a TLS address, but no certificate files were given: pass "
                          "--tls-ca-file, --tls-cert and --tls-key (Python: tls_ca_file=, tls_cert=, tls_key=), the "
                          "files `mlms scheduler --tls-setup DIR` made")


def connect(address: str, tls: dict | None = None):  # noqa: ANN201 - distributed.Client
    """A client of the scheduler at ``address`` (``tcp://host:8786`` or ``tls://...``), reused while it lives."""
    require("distributed", "evaluating on agents")
    from distributed import Client

    tls = {k: v for k, v in (tls or {}).items() if v}
    require_tls_files(address, tls)
    if tls and address.startswith("tcp://"):
        address = "tls://" + address.removeprefix("tcp://")
    key = (address, tuple(sorted(tls.items())))
    with _lock:
        client = _clients.get(key)
        if client is not None and client.status == "running":
            return client
        try:
            client = Client(address, security=security_for(tls, "client"), timeout=CONNECT_TIMEOUT_S,
                            set_as_default=False)
        except (OSError, TimeoutError) as err:
            raise AgentsError(f"no Dask scheduler answered at {address} within {CONNECT_TIMEOUT_S:g} s ({err}); "
                              "start one with `mlms scheduler` (and agents with `mlms agent --scheduler "
                              f"{address}`), or check the address{' and the TLS files' if tls else ''}") from None
        _clients[key] = client
        return client


def close_all() -> None:
    """Close every client made here (tests; a notebook ends them with its kernel)."""
    with _lock:
        for client in _clients.values():
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing what is already gone
                pass
        _clients.clear()
