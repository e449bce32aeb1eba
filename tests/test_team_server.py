"""The team server admits only its team and survives a lost disk.

A real PostgreSQL + `mlflow server --app-name basic-auth` on 127.0.0.1, started as
`make team-server` starts it (scripts/team-server.sh, auth on), always stopped; behind
nginx with a self-signed trial certificate (LABKIT_TEAM_TLS=1) where nginx is installed,
so every client below, the reproduction included, speaks HTTPS and verifies it. Users are
made with `labkit team user add`. What is checked: no credentials, no access (runs,
artifacts); a reader reads but never writes; an editor never deletes another's experiment;
an open non-loopback bind and a weak admin password are refused before anything starts;
backup, wipe and restore give back the same `labkit show` and `labkit regen` of a tiny
reproduction made before the backup; a truncated or altered archive is refused, and so is a
restore over a running server.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import requests

import tiny
from test_team import team_data_dir, team_script_env, tracking_client

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "team-server.sh"
TINY = tiny.as_cli({**tiny.FAST_01, "cost_models": []})
CREDS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "NETRC", "MLFLOW_TRACKING_SERVER_CERT_PATH")
NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")


def _free_port() -> int:
    from servers import free_port

    return free_port()


def _script_env(d: Path, port: int, **extra) -> dict:
    # PYTHONPATH: the server's workers import this checkout's labkit.provenance.auth_policy
    env = team_script_env(d, port, PYTHONPATH=str(ROOT / "src"), LABKIT_TEAM_WORKERS="1", **extra)
    return {k: v for k, v in env.items() if k not in CREDS}


def _script(*args, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout)


def _cli(args: list[str], *, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _netrc(path: str) -> tuple[str, str]:
    words = Path(path).read_text().split()
    return words[words.index("login") + 1], words[words.index("password") + 1]


class Team:
    """The server, its folder and each role's credentials (read from the netrc files
    `labkit team user add` wrote)."""

    def __init__(self, d: Path, port: int, *, tls: bool):
        self.d, self.port, self.url = d, port, f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.cert = str(d / "tls" / "cert.pem") if tls else None
        self.verify = self.cert or True  # what requests checks the server's certificate against
        self.script_env = _script_env(d, port, LABKIT_TEAM_AUTH="1", LABKIT_TEAM_TLS="1" if tls else "0")
        self.creds: dict[str, tuple[str, str]] = {}
        self.netrc: dict[str, str] = {}

    def add(self, name: str, role: str) -> None:
        r = _cli(["team", "user", "add", name, "--role", role, "--json"], env=self.script_env)
        assert r.returncode == 0, r.stderr[-2000:]
        self.netrc[name] = json.loads(r.stdout.strip().splitlines()[-1])["credentials"]
        self.creds[name] = _netrc(self.netrc[name])

    def env(self, name: str | None, *, trust: bool = True, **extra) -> dict:
        """A client's environment: ``name``'s credentials in MLflow's variables (None: none);
        ``trust``: it names the server's certificate."""
        env = {k: v for k, v in os.environ.items() if k not in CREDS}
        env.update(PYTHONPATH=str(ROOT / "src"), LABKIT_ROOT=str(ROOT), MLFLOW_TRACKING_URI=self.url)
        if self.cert and trust:
            env["MLFLOW_TRACKING_SERVER_CERT_PATH"] = self.cert
        env.update(extra)
        if name:
            env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"] = self.creds[name]
        return env

    def client(self, name: str, monkeypatch):
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", self.creds[name][0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", self.creds[name][1])
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        if self.cert:
            monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", self.cert)
        return tracking_client(self.url)

    def start(self) -> None:
        r = _script("start", env=self.script_env)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.strip().splitlines()[-1] == self.url

    def stop(self) -> None:
        _script("stop", env=self.script_env, timeout=180)


@pytest.fixture(scope="module")
def team():
    d = team_data_dir("lkauth.")
    t = Team(d, _free_port(), tls=NGINX is not None)
    try:
        t.start()
        assert (d / "auth" / "admin.password").stat().st_mode & 0o777 == 0o600
        assert (d / "auth" / "auth.ini").stat().st_mode & 0o777 == 0o600
        # a checked password is remembered for a minute: not a scrypt check (~140 ms) per request
        assert "auth_cache_ttl_seconds = 60" in (d / "auth" / "auth.ini").read_text()
        for name, role in (("rita", "reader"), ("ed", "editor"), ("eve", "editor")):
            t.add(name, role)
        yield t
    finally:
        t.stop()
        shutil.rmtree(d, ignore_errors=True)


# -- refused before anything starts ---------------------------------------------------------------
def test_an_open_non_loopback_bind_and_a_weak_admin_password_are_refused(tmp_path):
    env = _script_env(tmp_path, _free_port(), LABKIT_TEAM_HOST="0.0.0.0", LABKIT_TEAM_AUTH="0")
    r = _script("start", env=env, timeout=60)
    assert r.returncode == 1 and "refusing to serve 0.0.0.0" in r.stderr and "LABKIT_TEAM_OPEN=1" in r.stderr, r.stderr
    weak = tmp_path / "weak"
    weak.write_text("password\n")
    env = _script_env(tmp_path, _free_port(), LABKIT_TEAM_AUTH="1", LABKIT_TEAM_ADMIN_PASSWORD_FILE=str(weak))
    r = _script("start", env=env, timeout=60)
    assert r.returncode == 1 and "too weak" in r.stderr and "12 or more" in r.stderr, r.stderr
    assert "password" not in r.stderr.replace("admin password", "").replace("PASSWORD_FILE", "")
    assert not (tmp_path / "pgdata").exists() and not (tmp_path / "auth" / "auth.ini").exists()
    env = _script_env(tmp_path, _free_port(), LABKIT_TEAM_AUTH="1", LABKIT_TEAM_AUTH_CACHE_S="1m")
    r = _script("start", env=env, timeout=60)
    assert r.returncode == 1 and "LABKIT_TEAM_AUTH_CACHE_S=1m is not a whole number" in r.stderr, r.stderr
    assert not (tmp_path / "pgdata").exists() and not (tmp_path / "auth" / "auth.ini").exists()


# -- who may do what ------------------------------------------------------------------------------
@pytest.mark.slow
def test_without_credentials_nothing_is_read_or_written(team, monkeypatch):
    c = team.client("ed", monkeypatch)
    exp = c.create_experiment("auth-probe")
    run = c.create_run(exp)
    c.log_text(run.info.run_id, "evidence", "notes/a.txt")
    art = f"/api/2.0/mlflow-artifacts/artifacts/{exp}/{run.info.run_id}/artifacts/notes/a.txt"
    v = team.verify
    refused = {
        "create a run": requests.post(team.url + "/api/2.0/mlflow/runs/create", json={"experiment_id": exp}, verify=v),
        "read a run": requests.get(team.url + "/api/2.0/mlflow/runs/get", params={"run_id": run.info.run_id}, verify=v),
        "fetch an artifact": requests.get(team.url + art, verify=v),
        "a wrong password": requests.get(team.url + art, auth=(team.creds["rita"][0], "not-it"), verify=v),
    }
    assert {k: r.status_code for k, r in refused.items()} == dict.fromkeys(refused, 401)
    assert requests.get(team.url + art, auth=team.creds["rita"], verify=v).text == "evidence"  # a reader reads it
    assert requests.get(team.url + "/health", verify=v).status_code == 200
    # labkit says which variable to set, and never shows a password
    r = _cli(["show", "LAB:01-abcdef-zzzzz"], env=team.env(None))
    assert r.returncode == 2 and "401" in r.stderr and "MLFLOW_TRACKING_USERNAME" in r.stderr, r.stderr
    r = _cli(["show", "LAB:01-abcdef-zzzzz"], env=team.env(None, MLFLOW_TRACKING_USERNAME="rita",
                                                           MLFLOW_TRACKING_PASSWORD="wrong-secret"))
    assert r.returncode == 2 and "user 'rita'" in r.stderr and "wrong-secret" not in r.stderr, r.stderr
    # the netrc line `labkit team user add` wrote signs a client in by itself
    r = _cli(["show", "LAB:01-abcdef-zzzzz"], env=team.env(None, NETRC=team.netrc["rita"]))
    assert r.returncode == 2 and "no run has the provenance ID" in r.stderr, r.stderr


@pytest.mark.slow
def test_an_editor_never_deletes_another_editors_experiment(team, monkeypatch):
    from mlflow.exceptions import MlflowException

    ed = team.client("ed", monkeypatch)
    exp = ed.create_experiment("ed-owns-this")
    eve = team.client("eve", monkeypatch)
    run = eve.create_run(exp)  # editors log runs in every experiment (labkit's are shared)
    eve.log_metric(run.info.run_id, "x", 1.0)
    for who in ("eve", "rita"):
        with pytest.raises(MlflowException, match="PERMISSION_DENIED|403"):
            team.client(who, monkeypatch).delete_experiment(exp)
    with pytest.raises(MlflowException, match="PERMISSION_DENIED|403"):
        team.client("rita", monkeypatch).delete_run(run.info.run_id)
    assert team.client("ed", monkeypatch).get_experiment(exp).lifecycle_stage == "active"
    team.client("ed", monkeypatch).delete_experiment(exp)  # its creator may
    # a reader creates nothing, not even an experiment of its own to log into
    with pytest.raises(MlflowException, match="PERMISSION_DENIED|403"):
        team.client("rita", monkeypatch).create_experiment("rita-tries")


@pytest.fixture(scope="module")
def reproduction(team):
    """A tiny 01_cost_fit reproduced by the editor, with `labkit show` and `regen` of its figure."""
    out = Path(tempfile.mkdtemp(prefix="lkauth-run."))
    try:
        r = _cli(["reproduce", "--only", "01_cost_fit", *TINY, "--json", "--out", str(out / "run")],
                 env=team.env("ed"), timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        res = json.loads(r.stdout.strip().splitlines()[-1])["results"][0]
        yield {"id": res["id"], "fig": f"{res['id']}/cost-fit", "out": out}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _show_and_regen(team, fig: str, out: Path, who: str) -> tuple[str, dict, bytes]:
    r = _cli(["show", fig, "--json"], env=team.env(who))
    assert r.returncode == 0, r.stderr[-3000:]
    g = _cli(["regen", fig, "--out", str(out), "--json"], env=team.env(who))
    assert g.returncode == 0, g.stderr[-3000:]
    res = json.loads(g.stdout.strip().splitlines()[-1])
    assert res["identical"] is True
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.suffix in (".json", ".csv"))
    return r.stdout, res, b"".join(p.read_bytes() for p in files)


@pytest.fixture(scope="module")
def read_by_rita(team, reproduction):
    """The reader's `labkit show` and `regen` of the reproduction's figure, before any backup
    (one regen, read by both tests below)."""
    return _show_and_regen(team, reproduction["fig"], reproduction["out"] / "regen-rita", "rita")


@pytest.mark.slow
def test_a_reader_shows_compares_and_regens_but_never_logs(team, reproduction, read_by_rita):
    show = read_by_rita[0]
    assert json.loads(show.strip().splitlines()[-1])["provenance"]
    r = _cli(["compare", "--notebook", "01_cost_fit", "--by", "host"], env=team.env("rita"))
    assert "403" not in r.stderr and "401" not in r.stderr, r.stderr[-2000:]
    r = _cli(["reproduce", "--only", "01_cost_fit", *TINY, "--json", "--out", str(reproduction["out"] / "rita")],
             env=team.env("rita"), timeout=600)
    assert r.returncode == 2 and "403 permission denied" in r.stderr and "--role editor" in r.stderr, r.stderr[-3000:]


@pytest.mark.slow
def test_over_tls_a_client_that_does_not_trust_the_certificate_is_told_the_fix(team):
    if team.cert is None:
        pytest.skip("nginx is not installed: apt-get install -y nginx-light (or scripts/system-deps.sh)")
    import ssl

    subject = ssl._ssl._test_decode_cert(team.cert)["subject"]
    assert "SELF-SIGNED TRIAL" in str(subject)
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(team.url + "/health")  # the system's trust store does not know it
    r = _cli(["show", "LAB:01-abcdef-zzzzz"], env=team.env("rita", trust=False))
    assert r.returncode == 2 and "does not verify" in r.stderr and "MLFLOW_TRACKING_SERVER_CERT_PATH" in r.stderr, \
        r.stderr[-2000:]
    assert team.creds["rita"][1] not in r.stderr
    # plain HTTP to the TLS port gets nothing from mlflow
    assert requests.get(team.url.replace("https:", "http:") + "/health").status_code == 400


# -- backup, lose the disk, restore ---------------------------------------------------------------
def _altered(archive: Path, dst: Path, member: str, change) -> Path:
    """The archive with ``member`` changed by ``change`` (bytes -> bytes), the rest as it was."""
    with tarfile.open(archive) as src, tarfile.open(dst, "w:gz") as out:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name == member:
                data = change(data)
                m.size = len(data)
            out.addfile(m, io.BytesIO(data))
    return dst


def _backup(team, out: Path) -> Path:
    r = _script("backup", str(out), env=team.script_env)
    assert r.returncode == 0, r.stderr[-3000:]
    archive = Path(r.stdout.strip().splitlines()[-1])
    assert archive.parent == out and archive.stat().st_mode & 0o777 == 0o600
    return archive


@pytest.mark.slow
def test_a_damaged_archive_or_a_running_server_is_never_restored_over(team, tmp_path):
    archive = _backup(team, tmp_path / "backups")
    with tarfile.open(archive) as t:
        manifest = json.load(t.extractfile("MANIFEST.json"))
    assert manifest["schema"] and manifest["mlflow"]
    # a running server is never restored over without --force
    r = _script("restore", str(archive), env=team.script_env)
    assert r.returncode == 1 and "is running" in r.stderr and "--force" in r.stderr, r.stderr
    # a truncated archive, one whose checksums do not match and one of another MLflow schema
    # are refused before anything moves (the server is still up, and its data where it was)
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    flipped = _altered(archive, tmp_path / "altered.tar.gz", "artifacts.tar", lambda b: b[:-1] + bytes([b[-1] ^ 1]))
    newer = _altered(archive, tmp_path / "newer.tar.gz", "MANIFEST.json",
                     lambda b: json.dumps({**manifest, "schema": "ffffffffffff", "mlflow": "9.9.9"}).encode())
    for bad, why in ((truncated, "truncated"), (flipped, "does not match its checksums"),
                     (newer, "mlflow==9.9.9")):
        r = _script("restore", str(bad), "--force", env=team.script_env)
        assert r.returncode == 1 and why in r.stderr and "nothing was changed" in r.stderr, r.stderr
    assert requests.get(team.url + "/health", verify=team.verify).status_code == 200
    assert not list(team.d.glob("before-restore-*"))


@pytest.mark.slow
def test_backup_wipe_restore_gives_the_same_show_and_regen(team, reproduction, read_by_rita, tmp_path):
    before = read_by_rita
    archive = _backup(team, tmp_path / "backups")
    team.stop()
    # the disk is lost
    for what in ("pgdata", "artifacts"):
        shutil.rmtree(team.d / what)
    r = _script("restore", str(archive), env=team.script_env)
    assert r.returncode == 0, r.stderr[-3000:]
    team.start()
    after = _show_and_regen(team, reproduction["fig"], tmp_path / "after", "rita")
    assert after[0] == before[0]  # labkit show, byte for byte
    assert after[2] == before[2] and after[1]["identical"] is True  # the regenerated data
