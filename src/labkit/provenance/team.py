"""The team server's users: add one with a role, as its admin, over MLflow's auth REST API.

Runs on the server's host: the admin password is read from the file the server generated
(``$LABKIT_TEAM_DIR/auth/admin.password``, mode 0600) and goes only into the request's
Authorization header, never into argv, the environment or a log. A new user's password is
generated with ``secrets`` and written to a netrc file (``auth/users/NAME.netrc``, 0600) for
the operator to hand over: ``requests`` (under MLflow's client) reads ``~/.netrc`` by itself,
and the same two values go into MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD.

The roles are grants MLflow already knows (see ``auth_policy``): a reader holds none (READ on
everything, the server's ``default_permission``), an editor holds EDIT on experiment ``*``,
an admin is MLflow's ``is_admin``.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from urllib.parse import urlparse

from labkit.errors import LabkitError
from labkit.provenance.auth_policy import EDITOR_GRANT

ROLES = ("reader", "editor", "admin")
ADMIN = "admin"  # the admin_username scripts/team-server.sh writes into auth.ini


def team_dir() -> Path:
    """``$LABKIT_TEAM_DIR``, else the default of scripts/team-server.sh (kept in step with it)."""
    if os.environ.get("LABKIT_TEAM_DIR"):
        return Path(os.environ["LABKIT_TEAM_DIR"])
    if os.geteuid() == 0:
        return Path("/var/lib/labkit/team-server")
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share") / "labkit/team-server"


def team_url(d: Path) -> str:
    """The server as its own host reaches it: ``$LABKIT_TEAM_URL``, else loopback on
    ``$LABKIT_TEAM_PORT`` (5005), over HTTPS while the server's TLS proxy runs (its pid file)."""
    scheme = "https" if (d / "run" / "nginx.pid").exists() else "http"
    return os.environ.get("LABKIT_TEAM_URL") or f"{scheme}://127.0.0.1:{os.environ.get('LABKIT_TEAM_PORT', '5005')}"


def admin_password(d: Path) -> str:
    f = d / "auth" / "admin.password"
    try:
        return f.read_text().strip()
    except OSError as e:
        raise LabkitError(
            f"cannot read the team server's admin password {f} ({e.strerror})",
            "run this on the server's host as the user who started it, with LABKIT_TEAM_DIR as it was "
            "(start it with auth: `LABKIT_TEAM_AUTH=1 make team-server`, or on a non-loopback address)",
        ) from e


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name) or name == ADMIN:
        raise LabkitError(f"user name {name!r} is not allowed",
                          "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (not 'admin')")


def _request(url: str, method: str, path: str, auth: tuple[str, str], body: dict, *, d: Path):
    """One admin request; the certificate checked against MLFLOW_TRACKING_SERVER_CERT_PATH, else
    the server's own self-signed trial one (``tls/cert.pem``) when it has one, else the system's."""
    import requests

    trial = d / "tls" / "cert.pem"
    verify = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or (str(trial) if trial.is_file() else True)
    try:
        return requests.request(method, url.rstrip("/") + path, json=body, auth=auth, timeout=30, verify=verify)
    except requests.exceptions.SSLError as e:
        raise LabkitError(f"the certificate of {url} does not verify ({str(e)[:160]})",
                          "set MLFLOW_TRACKING_SERVER_CERT_PATH to the certificate the server was started with") from e
    except requests.exceptions.ConnectionError as e:
        raise LabkitError(f"the team server at {url} does not answer",
                          "start it (`make team-server`), or set LABKIT_TEAM_URL / LABKIT_TEAM_PORT to where it runs") from e


def add_user(name: str, role: str, *, url: str | None = None, d: Path | None = None,
             password: str | None = None, machine: str | None = None) -> dict:
    """Create ``name`` with ``role``; returns where its credentials were written (never them).
    ``machine``: the host name clients reach the server by (the netrc line's), default ``url``'s."""
    if role not in ROLES:
        raise LabkitError(f"no role {role!r}", f"use one of {', '.join(ROLES)}")
    _check_name(name)
    d = d or team_dir()
    url = url or team_url(d)
    auth = (ADMIN, admin_password(d))
    password = password or secrets.token_urlsafe(18)
    r = _request(url, "POST", "/api/2.0/mlflow/users/create", auth, {"username": name, "password": password}, d=d)
    if r.status_code == 401:
        raise LabkitError(f"the server at {url} refused the admin password in {d / 'auth' / 'admin.password'}",
                          "point LABKIT_TEAM_DIR at the folder of the server that LABKIT_TEAM_URL / LABKIT_TEAM_PORT names")
    if r.status_code != 200:
        if "already exists" in r.text or "RESOURCE_ALREADY_EXISTS" in r.text:
            raise LabkitError(f"user {name!r} already exists on {url}",
                              "choose another name; the existing user and its runs are unchanged")
        raise LabkitError(f"the server at {url} did not create user {name!r} (HTTP {r.status_code}: {r.text[:200]})",
                          "see the server's log (logs/mlflow.log under LABKIT_TEAM_DIR)")
    if role == "editor":
        kind, pattern, perm = EDITOR_GRANT
        r = _request(url, "POST", "/api/3.0/mlflow/users/permissions/grant", auth,
                     {"username": name, "resource_type": kind, "resource_id": pattern, "permission": perm}, d=d)
    elif role == "admin":
        r = _request(url, "PATCH", "/api/2.0/mlflow/users/update-admin", auth, {"username": name, "is_admin": True}, d=d)
    if r.status_code != 200:
        raise LabkitError(f"user {name!r} was created but its role {role!r} was not granted "
                          f"(HTTP {r.status_code}: {r.text[:200]}); it is a reader for now",
                          "see the server's log (logs/mlflow.log under LABKIT_TEAM_DIR)")
    creds = d / "auth" / "users" / f"{name}.netrc"
    creds.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"machine {machine or urlparse(url).hostname} login {name} password {password}\n")
    return {"user": name, "role": role, "url": url, "credentials": str(creds)}
