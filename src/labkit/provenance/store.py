"""The tracking store's plumbing: what kind of store a URI names, whether it answers,
and a SQLite file that several processes can write at once.

A SQLite store is one file on one machine; ``labkit reproduce`` (its papermill kernel
writes too), a second reproduction and a JupyterLab notebook may all write it together.
MLflow already sets a 20 s busy timeout per session; what it leaves open is two processes
creating the tables of a new file at once, and the rollback journal, in which a reader
holds off the writer. Both are closed here, once per process.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import exclusive


def store_kind(uri: str | None = None) -> str:
    """``sqlite`` (a file on this machine), ``http`` (an ``mlflow server``), ``database``
    (PostgreSQL/MySQL/MSSQL spoken to directly) or ``file`` (MLflow's folder store)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else "file"
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("http", "https", "databricks"):
        return "http"
    if scheme in ("postgresql", "postgres", "mysql", "mssql"):
        return "database"
    return "file"


def redact(uri: str) -> str:
    """A URI fit for a message: any password replaced by ***."""
    return re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", uri)


def probe(c, *, retries: int = 1, timeout: int = 10) -> Exception | None:
    """One quick question to the store; the exception when it does not answer, else None.

    The short retry/timeout apply to this call only (MLflow reads them per request): a
    long run keeps MLflow's own retries, so a server restart does not fail it."""
    saved = {k: os.environ.get(k) for k in _PROBE_ENV}
    os.environ.update({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries), "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout)})
    try:
        c.search_experiments(max_results=1)
        return None
    except Exception as e:  # mlflow raises several types for an unreachable server
        return e
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


_PROBE_ENV = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")

_CREDENTIALS = ("set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or put the line the server's "
                "admin gave you (`labkit team user add`) in ~/.netrc (mode 0600)")


def _chain(e: BaseException):
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def auth_error(e: BaseException, uri: str | None = None) -> LabkitError | None:
    """What a refused credential (401), a refused action (403) or a certificate that does not
    verify means for the user, naming the variable or file to fix; None for anything else.
    The credentials themselves are never in the message, only the user name."""
    uri = redact(uri or os.environ.get("MLFLOW_TRACKING_URI") or "")
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    for x in _chain(e):
        code, text = getattr(x, "error_code", None), str(x)
        if code == "UNAUTHENTICATED" or "error code 401" in text:
            who = (f"user {user!r} (MLFLOW_TRACKING_USERNAME): wrong password, or no such user" if user else
                   "MLFLOW_TRACKING_USERNAME is unset and no ~/.netrc line signed in")
            return LabkitError(f"the tracking server at {uri} asks for a user and password (401 not authenticated): {who}",
                               _CREDENTIALS)
        if code == "PERMISSION_DENIED" or "error code 403" in text:
            m = re.search(r"endpoint (\S+)", text)
            return LabkitError(
                f"the tracking server at {uri} refused user {user or '(from ~/.netrc)'} this action "
                f"({m.group(1) if m else 'a write'}): 403 permission denied",
                "readers may show, compare and regen only; ask the server's admin for the editor role "
                "(`labkit team user add NAME --role editor`), or sign in as an editor (MLFLOW_TRACKING_USERNAME)")
        if "CERTIFICATE_VERIFY_FAILED" in text or type(x).__name__ == "SSLError":
            cert = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH")
            return LabkitError(
                f"the certificate of the tracking server at {uri} does not verify"
                + (f" against MLFLOW_TRACKING_SERVER_CERT_PATH={cert}" if cert else ""),
                "set MLFLOW_TRACKING_SERVER_CERT_PATH to the server's certificate (its operator's file, or "
                "tls/cert.pem under the server's LABKIT_TEAM_DIR for a self-signed trial)")
    return None


def sqlite_client(uri: str):
    """A client on a SQLite file that several processes may write at once.

    Under a lock file: the first opener creates MLflow's tables (two processes creating
    them at once collide) and switches the file to WAL, which persists in the file:
    readers no longer block the writer, and MLflow's 20 s busy timeout covers writers.
    """
    import sqlite3

    from mlflow.tracking import MlflowClient

    path = Path(uri[len("sqlite:///"):])
    path.parent.mkdir(parents=True, exist_ok=True)
    # MLflow logs two INFO lines as it creates a new store's tables: on a first `labkit
    # advise` they come before the answer, in a notebook they are a cell's stderr box
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    with exclusive(path.with_name(path.name + ".lock")):
        con = sqlite3.connect(path, timeout=30)
        try:
            if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                con.execute("PRAGMA journal_mode=WAL")
        finally:
            con.close()
        c = MlflowClient(tracking_uri=uri)
        err = probe(c)
    if err is not None:
        raise LabkitError(f"the SQLite tracking store {path} cannot be opened ({type(err).__name__}: {str(err)[:200]})",
                          "check the file's permissions and free disk space, or point MLFLOW_TRACKING_URI elsewhere")
    return c
