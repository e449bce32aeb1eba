"""The arm journal: every measured arm kept as it finishes, readable by a later run.

A long measurement (the k sweep, the tool-suite control, power runs) reports each arm
it finishes through ``on_arm(key, row, records)`` (see ``labkit.measure.arms``). The
session's :class:`ArmBook` writes the arm first to the local journal (JSON lines) and
then to MLflow as ``arms/<kind>/<key>.json`` with the ``arms.done`` metric and the
``arms.done`` / ``arms.planned`` / ``arms.eta_s`` tags, so a run that dies (Ctrl-C,
SIGTERM, a dead kernel or engine) keeps every arm it finished, and ``labkit show``
counts them.

A resumed run *inherits* the arms of the interrupted one: they are copied into the new
run with their origin (the LAB run that measured them, its host, the time, and the arm's
place in that run's measuring order) and handed to the measurement as ``skip``. Across
the seam, :func:`drift_table` compares the plain arms measured last before the
interruption with the first after, so a resumed sweep cannot silently mix a busy box and
a quiet one.
"""

from __future__ import annotations

import json
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ORIGIN_COLUMNS = ("origin", "origin_host", "origin_time", "origin_seq")
DRIFT_ARMS = 3  # plain arms compared on each side of a resume seam
DRIFT_TOL = 0.10  # single generations: flag a median shift beyond 10% or the recorded range
SAY_EVERY_S = 10.0  # progress lines on stderr at most this often
WATCH_EVERY_S = 15.0  # a journal watcher's progress lines at most this often


def compact(records):
    """Step records as ``{"fields": [...], "rows": [[...], ...]}`` (a dict of them per task)."""
    if records is None:
        return None
    if isinstance(records, dict):
        return {k: compact(v) for k, v in records.items()}
    dicts = [r.to_dict() if hasattr(r, "to_dict") else dict(r) for r in records]
    fields = list(dicts[0]) if dicts else []
    return {"fields": fields, "rows": [[d.get(f) for f in fields] for d in dicts]}


def _plain(o):
    """JSON for numpy scalars and arrays (rows carry them); anything else as text."""
    if hasattr(o, "item") and getattr(o, "ndim", 1) == 0:
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def dumps(obj) -> str:
    return json.dumps(obj, default=_plain)


class _Kind:
    def __init__(self):
        self.planned: list[str] = []
        self.rows: dict[str, dict] = {}  # key -> row (with origin columns), inherited or measured
        self.inherited = 0
        self.measured = 0
        self.t_first: float | None = None  # when this run began measuring arms of this kind
        self.drift_checked = False
        self.drift: list[dict] = []  # the seams found when it was checked


class ArmBook:
    """The arms of one run, by kind: journal, MLflow, tags, progress (one per session)."""

    def __init__(self, *, client, run_id: str, run_key: str, journal: Callable[[dict], None],
                 mlflow: Callable[[Callable], None], say: Callable[[str], None] | None = None,
                 bar: Callable[[str, int, int, float | None], None] | None = None):
        # bar(kind, done, planned, eta_s): a live progress bar (JupyterLab) instead of `say` lines
        self._bar = bar
        self.client, self.run_id, self.run_key = client, run_id, run_key
        self._journal, self._mlflow = journal, mlflow
        self._say = say or (lambda m: print(m, file=sys.stderr, flush=True))
        self.kinds: dict[str, _Kind] = {}
        self.seq = 0  # arms measured by this run, all kinds: each arm's place in the order
        self.host = platform.node()
        self._said = 0.0

    def kind(self, kind: str) -> _Kind:
        return self.kinds.setdefault(kind, _Kind())

    def totals(self) -> tuple[int, int]:
        done = sum(len(k.rows) for k in self.kinds.values())
        planned = sum(len(set(k.planned) | set(k.rows)) for k in self.kinds.values())
        return done, planned

    def on_arm(self, kind: str) -> ArmLog:
        return ArmLog(self, kind)

    # -- inheriting an interrupted run's arms ---------------------------------------------
    def inherit(self, kind: str, entries: dict[str, dict], *, source: str) -> dict[str, dict]:
        """Copy ``entries`` (key -> journal entry of an earlier run) into this run, and
        return them as ``skip`` rows (with their records under ``_records``)."""
        k = self.kind(kind)
        skip = {}
        if not entries:
            return skip
        with tempfile.TemporaryDirectory() as d:
            for key, e in entries.items():
                entry = {**e, "run": self.run_key, "inherited_from": source}
                self._journal({k2: v for k2, v in entry.items() if k2 != "run"})
                Path(d, f"{key}.json").write_text(dumps(entry))
                k.rows[key] = e["row"]
                skip[key] = {**e["row"], "_records": e.get("records")}
            k.inherited += len(entries)
            self._mlflow(lambda: self.client.log_artifacts(self.run_id, d, f"arms/{kind}"))
        origins = {}
        for row in k.rows.values():
            origins[row.get("origin")] = origins.get(row.get("origin"), 0) + 1
        extra = {"arms.inherited": str(sum(x.inherited for x in self.kinds.values())),
                 f"arms.{kind}.origins": json.dumps(origins)}
        self._mlflow(lambda: self._tags(kind, extra=extra))
        self._say(f"arms {kind}: {len(entries)} inherited from LAB:{source}")
        return skip

    # -- recording ----------------------------------------------------------------------
    def record(self, kind: str, key: str, row: dict, records) -> dict:
        k = self.kind(kind)
        if k.t_first is None:  # an on_arm never told the plan
            k.t_first = time.perf_counter()
        self.seq += 1
        k.measured += 1
        origin = {"origin": self.run_key, "origin_host": self.host,
                  "origin_time": time.strftime("%Y-%m-%dT%H:%M:%S"), "origin_seq": self.seq}
        row = {**row, **origin}
        k.rows[key] = {c: v for c, v in row.items() if not c.startswith("_")}
        done, planned = len(k.rows), len(set(k.planned) | set(k.rows))
        eta = self._eta(k, planned - done)
        entry = {"type": "arm", "kind": kind, "key": key, "row": row, "records": compact(records),
                 "done": done, "planned": planned, "eta_s": eta}
        self._journal(json.loads(dumps(entry)))  # the local journal first: it survives a dead store

        def log():
            self.client.log_text(self.run_id, dumps({"run": self.run_key, **entry}), f"arms/{kind}/{key}.json")
            self._tags(kind, metric=True)

        self._mlflow(log)
        self._progress(kind, done, planned, eta)
        return origin

    def _eta(self, k: _Kind, remaining: int) -> float | None:
        if not k.measured or k.t_first is None:
            return None
        return (time.perf_counter() - k.t_first) / k.measured * remaining

    def _tags(self, kind: str, *, metric: bool = False, extra: dict | None = None) -> None:
        from mlflow.entities import Metric, RunTag

        k = self.kind(kind)
        done, planned = self.totals()
        kd, kp = len(k.rows), len(set(k.planned) | set(k.rows))
        eta = self._eta(k, kp - kd)
        tags = {"arms.done": str(done), "arms.planned": str(planned), f"arms.{kind}.done": str(kd),
                f"arms.{kind}.planned": str(kp), **(extra or {})}
        if eta is not None:
            tags["arms.eta_s"] = f"{eta:.0f}"
        now = int(time.time() * 1000)
        metrics = [Metric("arms.done", float(done), now, done)] if metric else []
        self.client.log_batch(self.run_id, metrics=metrics, tags=[RunTag(a, b) for a, b in tags.items()])

    def _progress(self, kind: str, done: int, planned: int, eta: float | None) -> None:
        if self._bar is not None:
            self._bar(kind, done, planned, eta)
            return
        now = time.monotonic()
        if done < planned and now - self._said < SAY_EVERY_S:
            return
        self._said = now
        self._say(progress_text(kind, done, planned, eta))

    def plan(self, kind: str, keys: list[str]) -> None:
        k = self.kind(kind)
        if k.t_first is None:
            k.t_first = time.perf_counter()  # the ETA counts from here
        k.planned += [x for x in keys if x not in set(k.planned)]
        self._mlflow(lambda: self._tags(kind))
        if self._bar is not None:
            self._bar(kind, len(k.rows), len(set(k.planned) | set(k.rows)), None)

    # -- the seam ------------------------------------------------------------------------
    def drift_due(self) -> list[str]:
        """Kinds whose planned arms are all done, measured by more than one run, not yet checked.
        A run that inherited every arm (its sweep finished before the last interruption) is
        checked too: its table is made of those runs' arms, so its seams are its own."""
        out = []
        for name, k in self.kinds.items():
            origins = {r.get("origin") for r in k.rows.values()}
            if (not k.drift_checked and k.planned and len(origins) > 1
                    and set(k.planned) <= set(k.rows)):
                k.drift_checked = True
                out.append(name)
        return out

    def rows_in_order(self, kind: str) -> list[dict]:
        k = self.kind(kind)
        return [k.rows[x] for x in k.planned if x in k.rows]


class ArmLog:
    """``on_arm`` for one kind: a callable with ``plan(keys)``, handed to measurements."""

    def __init__(self, book: ArmBook, kind: str):
        self.book, self.kind = book, kind

    def plan(self, keys: list[str]) -> None:
        self.book.plan(self.kind, keys)

    def __call__(self, key: str, row: dict, records) -> dict:
        return self.book.record(self.kind, key, row, records)


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# -- reading arms back -------------------------------------------------------------------
def read_arms(c, run, kind: str) -> dict[str, dict]:
    """key -> journal entry of every arm of ``kind`` an earlier run kept: its MLflow
    artifacts, plus any arm only its local journal has (a store that failed mid-run)."""
    rid, run_key = run.info.run_id, run.data.tags.get("lab.run")
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        try:
            local = Path(c.download_artifacts(rid, f"arms/{kind}", d))
            files = sorted(local.glob("*.json"))
        except Exception:  # no arm of this kind was logged
            files = []
        for f in files:
            e = json.loads(f.read_text())
            out[e["key"]] = e
    journal = run.data.tags.get("lab.journal")
    if journal and Path(journal).is_file():
        for line in Path(journal).read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:  # the last line of a killed writer may be cut short
                continue
            if e.get("type") == "arm" and e.get("kind") == kind and e.get("run") == run_key:
                out.setdefault(e["key"], e)
    return out


def progress_text(kind: str, done: int, planned: int, eta: float | None) -> str:
    """``arms sweep: 431/454 · ETA 0m36s``. No ETA once every planned arm is done: a search
    plans its rounds one at a time, so "ETA 0m00s" there would read as the notebook's end
    while the next round is about to be planned."""
    return f"arms {kind}: {done}/{planned}" + (f" · ETA {fmt_s(eta)}" if eta is not None and done < planned else "")


PROGRESS_LINE = re.compile(r"^arms \S+: \d+/\d+")  # what progress_text writes, to recognise it


def journal_progress(path: Path, offset: int) -> tuple[list[dict], int]:
    """Arm entries appended to a journal since ``offset`` (for a watcher in another process)."""
    if not path.is_file():
        return [], offset
    with open(path) as f:
        f.seek(offset)
        text = f.read()
    complete = text[: text.rfind("\n") + 1]
    out = []
    for line in complete.splitlines():
        if '"type": "arm"' in line[:200]:
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            out.append({k: e.get(k) for k in ("kind", "key", "done", "planned", "eta_s", "inherited_from")})
    return out, offset + len(complete.encode())


# -- drift across a resume seam ----------------------------------------------------------
def _is_plain(row: dict) -> bool:
    if row.get("cold") or row.get("warmup"):
        return False
    if "k" in row:
        return row["k"] == 0
    return row.get("spec") == "off"


def drift_table(rows: list[dict], *, n: int = DRIFT_ARMS, tol: float = DRIFT_TOL) -> list[dict]:
    """One row per resume seam: decode tok/s of the ``n`` plain warm arms measured last
    before it against the ``n`` first after it. ``moved`` when the ratio of medians is
    outside the before arms' relative range, or ``tol``, whichever is wider. ``rows`` are
    in the order the arms were planned (which is the order they were measured)."""
    plain = [r for r in rows if _is_plain(r) and r.get("decode_tok_s") is not None and r.get("origin")]
    segments: list[list[dict]] = []
    for r in plain:
        if segments and segments[-1][0]["origin"] == r["origin"]:
            segments[-1].append(r)
        else:
            segments.append([r])
    out = []
    for a, b in zip(segments, segments[1:]):
        before = [float(r["decode_tok_s"]) for r in a[-n:]]
        after = [float(r["decode_tok_s"]) for r in b[:n]]
        m0, m1 = statistics.median(before), statistics.median(after)
        spread = (max(before) - min(before)) / m0 if m0 else 0.0
        band = max(tol, spread)
        ratio = m1 / m0 if m0 else float("nan")
        out.append({"before": a[-1]["origin"], "before_host": a[-1].get("origin_host"),
                    "before_until": a[-1].get("origin_time"), "after": b[0]["origin"],
                    "after_host": b[0].get("origin_host"), "after_from": b[0].get("origin_time"),
                    "n_before": len(before), "n_after": len(after), "tok_s_before": m0, "tok_s_after": m1,
                    "ratio": ratio, "band": band, "basis": "recorded range" if spread > tol else f"{tol:.0%}",
                    "moved": bool(abs(ratio - 1) > band)})
    return out


class JournalWatcher:
    """Arm progress (done / planned, ETA) from a journal another process writes, on
    ``say`` at most every ``every_s`` seconds and when a kind completes."""

    def __init__(self, path: Path, say: Callable[[str], None], *, label: str = "", every_s: float = WATCH_EVERY_S,
                 poll_s: float = 2.0):
        import threading

        self.path, self.say, self.label, self.every_s, self.poll_s = Path(path), say, label, every_s, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._offset, self._said = 0, 0.0

    def __enter__(self) -> JournalWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                arms, self._offset = journal_progress(self.path, self._offset)
            except OSError:
                continue
            done = [a for a in arms if a.get("done") is not None and not a.get("inherited_from")]
            if not done:
                continue
            last = done[-1]
            now = time.monotonic()
            if now - self._said >= self.every_s or last["done"] >= last["planned"]:
                self._said = now
                self.say(self.label + progress_text(last["kind"], last["done"], last["planned"], last.get("eta_s")))
