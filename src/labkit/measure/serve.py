"""llama.cpp's own server, as users deploy it: c streaming clients, speculation off vs on.

One ``llama-server`` process per arm configuration (plain; each spec k; the A/A arm's
second plain process), built from the wheel's own sources (``artifacts.server_build``),
starts on 127.0.0.1 with ``-np`` the largest c (as labkit's loop keeps one engine with
that many sequences for every c) and the spec flags, is polled on ``/health`` until it
answers ok (bounded) and gets one warm-up request. The processes stay up for the whole
grid, so the arms interleave without paying a server start each (~2-3 s on a 2-core box,
27 times in 07's grid); before each arm every slot is erased (``POST /slots/i?action=erase``,
which is why ``--slot-save-path`` is set), so each arm starts from an empty cache, as a
fresh server would. Then c client threads send the same request queue as labkit's loop
(closed loop: a client sends its next request when its stream ends) to
``POST /completion`` with ``stream: true``. Prompts go as token ids (exactly labkit's,
BOS included), greedy, no prompt cache (each request prefills, as in labkit's loop). Per request: TTFT and TTLT
from the moment it was sent, the token ids streamed back, and the server's own
``timings`` (``predicted_n``, ``draft_n``, ``draft_n_accepted``).

The server is always stopped (its whole process group), whatever happens. A server that
does not start, dies, or answers with an error raises :class:`ServerError`: a
LabkitError quoting the server's log tail, with the requests measured before it in
``.kept``.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from labkit.analysis.decide import AA
from labkit.analysis.stats import spread
from labkit.errors import LabkitError
from labkit.measure import order
from labkit.measure.concurrency import AA_ARM, pct, sum_per_pos
from labkit.measure.verify_cost import Progress

SPEC_TYPES = ("ngram-simple", "ngram-cache", "draft-simple", "draft-mtp")
NEEDS_DRAFT_MODEL = ("draft-simple",)
HEALTH_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 120.0


class ServerError(LabkitError):
    """llama-server failed; ``kept`` holds the requests measured before the failure."""

    def __init__(self, problem: str, fix: str | None = None, *, kept: list | None = None, log_tail: str = ""):
        super().__init__(problem, fix)
        self.kept = kept or []
        self.log_tail = log_tail
        self.partial: dict = {}  # bench_serve: the arms finished before the failure
        self.arm: dict | None = None


def ensure_built(progress: Progress = None) -> dict:
    """The cached llama-server build for this machine, built first if there is none (minutes)."""
    from labkit.artifacts import server_build

    return server_build.build(progress=progress)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(*, model: str, port: int, c: int, n_ctx_per_slot: int, threads: int, spec_type: str | None = None,
                k: int = 0, draft_model: str | None = None, kv_unified: bool = True, ngram_n: int = 4,
                slot_save_path: str | None = None) -> list[str]:
    """llama-server's flags for one arm (k = 0 or no spec type: plain).

    The KV layout is labkit's engine's: a full-size SWA cache and, by default, one unified
    KV buffer (``--kv-unified``; llama-server's own default for ``-np N`` is one stream per
    slot, whose equal-split micro-batches make ragged speculative batches cost several
    passes, see ``engines.llamacpp``). No prompt cache: every request prefills. ``ngram_n``:
    the n-gram lookup length of ``ngram-simple`` (labkit's n-gram drafter looks up 2..4).
    ``slot_save_path`` enables ``POST /slots`` (``Server.erase_slots`` needs it; nothing is saved).
    """
    args = ["-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", str(c),
            "-c", str(n_ctx_per_slot * c), "-t", str(threads), "-tb", str(threads),
            "--swa-full", "--kv-unified" if kv_unified else "--no-kv-unified", "--cache-ram", "0", "--no-webui",
            "--metrics"]  # /metrics: llama-server's own counters, per-position acceptance among them
    if slot_save_path:
        args += ["--slot-save-path", str(slot_save_path)]
    if spec_type and k > 0:
        if spec_type not in SPEC_TYPES:
            raise LabkitError(f"unknown spec type {spec_type!r}", f"use one of {', '.join(SPEC_TYPES)}")
        args += ["--spec-type", spec_type, "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0"]
        if spec_type == "ngram-simple":
            # ngram-simple's draft length is its m-gram size (default 48), not --spec-draft-n-max
            # (common/speculative.cpp at the vendored commit): without this a "k=1" arm drafts up to
            # 48 tokens, as llama-server's own per-position counters showed. And it drafts nothing
            # when the m-gram is shorter than the lookup n-gram (default 12; common/ngram-map.cpp:
            # copy_max < size_n), so the lookup is min(ngram_n, k) tokens
            args += ["--spec-ngram-simple-size-m", str(k), "--spec-ngram-simple-size-n", str(min(ngram_n, k))]
        if spec_type in NEEDS_DRAFT_MODEL:
            if not draft_model:
                raise LabkitError(f"--spec-type {spec_type} needs a draft model",
                                  "set draft_model in the recipe or pass --draft-model")
            args += ["-md", str(draft_model), "-td", str(threads)]
    return args


class Server:
    """One llama-server process on loopback; a context manager that always stops it."""

    def __init__(self, binary: str, args: Sequence[str], *, port: int, health_timeout_s: float = HEALTH_TIMEOUT_S):
        self.binary, self.args, self.port = binary, list(args), port
        self.health_timeout_s = health_timeout_s
        self.proc: subprocess.Popen | None = None
        self._logf = tempfile.NamedTemporaryFile("w+b", prefix="llama-server-", suffix=".log", delete=False)
        self.log_path = Path(self._logf.name)

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def fail(self, problem: str, fix: str, *, kept: list | None = None) -> ServerError:
        tail = self.log_tail()
        return ServerError(f"{problem}; llama-server log tail:\n{tail}", fix, kept=kept, log_tail=tail)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Server:
        self.proc = subprocess.Popen([self.binary, *self.args], stdin=subprocess.DEVNULL, stdout=self._logf,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.health_timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise self.fail(f"llama-server exited with code {self.proc.returncode} before it was healthy",
                                "read the log tail above (a bad model path, a port in use, a bad flag)")
            try:
                status, _ = self.get("/health", timeout=2.0)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise self.fail(f"llama-server was not healthy after {self.health_timeout_s:.0f} s",
                        "the model may be too large for this box; check the log tail")

    def get(self, path: str, *, timeout: float = 5.0) -> tuple[int, bytes]:
        return self._request("GET", path, timeout=timeout)

    def post(self, path: str, *, timeout: float = 5.0) -> tuple[int, bytes]:
        return self._request("POST", path, timeout=timeout)

    def _request(self, method: str, path: str, *, timeout: float) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def erase_slots(self, n: int) -> int:
        """Empty the KV cache of slots 0..n-1 (``POST /slots/i?action=erase``; the server must
        run with ``--slot-save-path``); returns the cached tokens erased. An arm on a server
        that ran arms before then starts from what a fresh server has: no cells in use."""
        erased = 0
        for i in range(n):
            try:
                status, body = self.post(f"/slots/{i}?action=erase", timeout=30.0)
            except OSError as e:
                raise self.fail(f"llama-server did not erase slot {i}: {e}", "read the log tail above") from None
            if status != 200:
                raise self.fail(f"llama-server refused to erase slot {i} (HTTP {status}: "
                                f"{body[:200].decode(errors='replace')})",
                                "start it with --slot-save-path (server_args(slot_save_path=...))")
            erased += int(json.loads(body).get("n_erased", 0))
        return erased

    def stop(self) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after 5 s."""
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._logf.close()

    def cleanup(self) -> None:
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Server:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def stream_completion(port: int, prompt: Sequence[int], *, max_tokens: int,
                      timeout: float = REQUEST_TIMEOUT_S) -> dict:
    """One streaming /completion request (greedy, token ids in and out), timed at the client."""
    body = json.dumps({"prompt": list(map(int, prompt)), "n_predict": max_tokens, "temperature": 0.0,
                       "stream": True, "cache_prompt": False, "return_tokens": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    t_first = t_last = None
    tokens: list[int] = []
    timings: dict = {}
    stop_type = None
    try:
        conn.request("POST", "/completion", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise _HTTPError(f"HTTP {r.status}: {r.read(500).decode(errors='replace')}")
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            msg = json.loads(line[5:])
            if "error" in msg:
                raise _HTTPError(f"server error: {msg['error']}")
            now = time.perf_counter()
            if msg.get("tokens"):
                tokens.extend(msg["tokens"])
                t_first = t_first or now
                t_last = now
            if msg.get("stop"):
                timings = msg.get("timings", {})
                stop_type = msg.get("stop_type")
                break
    finally:
        conn.close()
    if t_first is None:
        raise _HTTPError("the stream ended without a token")
    if stop_type is None:
        raise _HTTPError("the stream ended without its final message")
    return {"t_send": t0, "ttft_ms": (t_first - t0) * 1e3, "ttlt_ms": (t_last - t0) * 1e3, "tokens": tokens,
            "stop_type": stop_type, "timings": timings, "t_end": t_last}


class _HTTPError(Exception):
    pass


def drive(server: Server, requests: Sequence[Sequence[int]], *, c: int, max_tokens: int,
          deadline_s: float = 600.0, kept: list | None = None,
          on_result: Callable[[dict, Server], None] | None = None) -> list[dict]:
    """c client threads, closed loop over ``requests`` (token id lists); bounded by ``deadline_s``.

    Results are appended to ``kept`` as they complete (so a failure loses none of them).
    """
    kept = [] if kept is None else kept
    queue = deque(enumerate(requests))
    lock = threading.Lock()
    errors: list[str] = []
    t_end = time.monotonic() + deadline_s

    def client():
        while True:
            with lock:
                if errors or not queue or time.monotonic() > t_end:
                    return
                i, prompt = queue.popleft()
            try:
                res = stream_completion(server.port, prompt, max_tokens=max_tokens)
            except (OSError, _HTTPError, http.client.HTTPException, ValueError) as e:
                with lock:
                    errors.append(f"request {i}: {type(e).__name__}: {e}")
                return
            with lock:
                kept.append({"request": i, **res})
            if on_result:
                on_result(res, server)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s + REQUEST_TIMEOUT_S)
    if errors:
        dead = not server.alive
        raise server.fail(
            ("llama-server died mid-run" if dead else "llama-server answered with an error")
            + f" ({errors[0]}); {len(kept)} requests were measured before it",
            "read the log tail above; the measured requests are kept", kept=list(kept))
    return kept


def arm_stats(results: Sequence[dict]) -> dict:
    """Aggregate and per-stream tok/s, TTFT/TTLT, acceptance from the server's own timings."""
    if not results:
        return {"requests": 0, "agg_tok_s": None, "per_stream_tok_s": None, "ttft_ms": [], "ttlt_ms": [],
                "drafted": 0, "accepted": 0}
    t0 = min(r["t_send"] for r in results)
    t1 = max(r["t_end"] for r in results)
    tokens = sum(len(r["tokens"]) for r in results)
    per = [1e3 * (len(r["tokens"]) - 1) / (r["ttlt_ms"] - r["ttft_ms"]) for r in results
           if len(r["tokens"]) > 1 and r["ttlt_ms"] > r["ttft_ms"]]
    drafted = sum(r["timings"].get("draft_n", 0) for r in results)
    accepted = sum(r["timings"].get("draft_n_accepted", 0) for r in results)
    return {"requests": len(results), "tokens": tokens, "wall_ms": (t1 - t0) * 1e3,
            "agg_tok_s": tokens / (t1 - t0) if t1 > t0 else None,
            "per_stream_tok_s": float(np.median(per)) if per else None,
            "ttft_ms": [r["ttft_ms"] for r in results], "ttlt_ms": [r["ttlt_ms"] for r in results],
            "drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted if drafted else None,
            "predicted_n": sum(r["timings"].get("predicted_n", 0) for r in results)}


def bench_serve(
    binary: str,
    model: str,
    prompts: Sequence[Sequence[int]],
    *,
    cs: Sequence[int] = (1, 2, 4),
    ks: Sequence[int] = (0, 3),
    spec_type: str = "ngram-simple",
    draft_model: str | None = None,
    threads: int = 2,
    n_ctx_per_slot: int = 1024,
    runs: int = 1,
    n_requests: int | None = None,
    max_tokens: int = 64,
    seed: int = 0,
    interleave: str = order.DEFAULT_POLICY,
    deadline_s: float = 600.0,
    health_timeout_s: float = HEALTH_TIMEOUT_S,
    kv_unified: bool = True,
    control: bool = False,
    progress: Progress = None,
) -> dict:
    """Spec off vs on at each c on llama-server, arms interleaved; rows like labkit's.

    ``control`` adds the A/A arm at each c: llama-server's plain arm measured a second time as
    its own arm (row drafter "aa", k 0), which must read "no measurable difference" from plain."""
    cs, ks = sorted(set(cs)), sorted(set(ks))
    n = n_requests or max(max(cs), len(prompts))
    reqs = [list(prompts[i % len(prompts)]) for i in range(n)]
    arms = [(c, k) for c in cs for k in ks] + ([(c, AA_ARM) for c in cs] if control else [])
    results: dict[tuple, list] = {a: [] for a in arms}
    outputs: dict[tuple, list] = {a: [] for a in arms}
    n_slots = max(cs)
    servers: dict[int, Server] = {}  # one process per arm configuration (k; AA_ARM: the A/A's own plain process)

    def server_for(k: int, slots_dir: str) -> Server:
        if k not in servers:
            port = free_port()
            args = server_args(model=model, port=port, c=n_slots, n_ctx_per_slot=n_ctx_per_slot, threads=threads,
                               spec_type=spec_type, k=max(k, 0), draft_model=draft_model, kv_unified=kv_unified,
                               slot_save_path=slots_dir)
            srv = servers[k] = Server(binary, args, port=port, health_timeout_s=health_timeout_s)
            srv.start()
            try:
                stream_completion(port, reqs[0], max_tokens=8)  # warm-up, not recorded
            except (OSError, _HTTPError, http.client.HTTPException, ValueError) as e:
                raise srv.fail(f"llama-server's warm-up request failed: {e}", "read the log tail above") from None
        return servers[k]

    with tempfile.TemporaryDirectory(prefix="labkit-slots-") as slots_dir:
        try:
            for r in range(runs):
                for c, k in order.arm_order(arms, r, policy=interleave, seed=seed):
                    try:
                        srv = server_for(k, slots_dir)
                        srv.erase_slots(n_slots)
                        before = spec_metrics(srv)
                        kept = drive(srv, reqs, c=c, max_tokens=max_tokens, deadline_s=deadline_s)
                        counters = metrics_delta(before, spec_metrics(srv))
                    except ServerError as e:
                        # what the finished arms measured travels with the error
                        e.partial = {f"c{a[0]}_k{a[1]}": v for a, v in results.items() if v}
                        e.arm = {"c": c, "k": k, "round": r}
                        raise
                    s = {**arm_stats(kept), "server_draft_steps": counters.get("drafts"),
                         "server_accepted_per_pos": counters.get("per_pos"),
                         "server_draft_tokens": counters.get("draft_tokens"), "server_accepted": counters.get("accepted")}
                    results[(c, k)].append(s)
                    outputs[(c, k)].append({x["request"]: x["tokens"] for x in kept})
                    if progress:
                        arm = "A/A (plain again)" if k == AA_ARM else f"k={k}"
                        progress(f"llama-server round {r + 1}/{runs} c={c} {arm}: {s['agg_tok_s'] or 0:.1f} tok/s "
                                 "aggregate")
        finally:
            for srv in servers.values():
                srv.stop()
                srv.cleanup()
    rows = [_row(c, k, results[(c, k)], spec_type) for c, k in arms]
    base = {c: next(r for r in rows if r["c"] == c and r["k"] == min(ks) and r["drafter"] != AA) for c in cs}
    for row in rows:
        b = base[row["c"]]["agg_tok_s"]
        row["speedup"] = row["agg_tok_s"] / b if min(ks) == 0 and b and row["agg_tok_s"] else None
    return {"kind": "serve", "engine": "llama-server", "binary": binary, "cs": cs, "ks": ks, "spec_type": spec_type,
            "runs": runs, "requests": n, "max_tokens": max_tokens, "threads": threads, "kv_unified": kv_unified,
            "interleave": order.describe(interleave, seed), "rows": rows,
            "servers": (f"one llama-server process per arm configuration ({len(servers)}), -np {n_slots} "
                        "for every c, all slots erased before each arm"),
            "outputs": {f"c{c}_k{k}": v for (c, k), v in outputs.items() if k != AA_ARM},
            "request_prompts": [i % len(prompts) for i in range(n)]}


def parse_metrics(text: str) -> dict:
    """The speculative counters of llama-server's Prometheus text (``--metrics``): drafts
    (verification steps), draft_tokens, accepted, and per_pos (accepted tokens per draft
    position, ``llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}``)."""
    names = {"llamacpp:spec_decode_num_drafts_total": "drafts",
             "llamacpp:spec_decode_num_draft_tokens_total": "draft_tokens",
             "llamacpp:spec_decode_num_accepted_tokens_total": "accepted"}
    out: dict = {"per_pos": {}}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^(\S+?)(?:\{position="(\d+)"\})?\s+(\S+)$', line)
        if not m:
            continue
        name, pos, value = m.group(1), m.group(2), float(m.group(3))
        if name == "llamacpp:spec_decode_num_accepted_tokens_per_pos_total" and pos is not None:
            out["per_pos"][int(pos)] = value
        elif name in names:
            out[names[name]] = value
    return out


def spec_metrics(srv: Server) -> dict | None:
    """/metrics now, parsed; None when the server does not serve it."""
    try:
        status, body = srv.get("/metrics")
    except OSError:
        return None
    return parse_metrics(body.decode(errors="replace")) if status == 200 else None


def metrics_delta(before: dict | None, after: dict | None) -> dict:
    """What one arm added to the counters: ``per_pos`` as a list by position."""
    if after is None:
        return {}
    b = before or {"per_pos": {}}
    n = max(after["per_pos"], default=-1) + 1
    return {**{k: int(after.get(k, 0) - b.get(k, 0)) for k in ("drafts", "draft_tokens", "accepted") if k in after},
            "per_pos": [int(after["per_pos"].get(i, 0) - b["per_pos"].get(i, 0)) for i in range(n)]}


def _total(values) -> int | None:
    v = [x for x in values if x is not None]
    return int(sum(v)) if v else None


def _row(c: int, k: int, res: list[dict], spec_type: str) -> dict:
    agg = spread([x["agg_tok_s"] for x in res])
    per = spread([x["per_stream_tok_s"] for x in res])
    ttft = [t for x in res for t in x["ttft_ms"]]
    ttlt = [t for x in res for t in x["ttlt_ms"]]
    drafted, accepted = sum(x["drafted"] for x in res), sum(x["accepted"] for x in res)
    return {"c": c, "k": max(k, 0), "drafter": AA if k == AA_ARM else (spec_type if k else "none"),
            "engine": "llama-server",
            "agg_tok_s": agg["median"], "agg_tok_s_min": agg["min"], "agg_tok_s_max": agg["max"],
            "agg_runs": agg["values"], "per_stream_tok_s": per["median"], "ttft_p50_ms": pct(ttft, 50), "ttft_p95_ms": pct(ttft, 95),
            "ttlt_p50_ms": pct(ttlt, 50), "ttlt_p95_ms": pct(ttlt, 95),
            "acceptance": accepted / drafted if drafted else None, "drafted": drafted, "accepted": accepted,
            "rows_per_step": None, "runs": len(res), "lossless": None,
            # llama-server's own /metrics counters for this arm (warm-up excluded)
            "draft_steps": _total([x.get("server_draft_steps") for x in res]),
            "accepted_per_pos": sum_per_pos([x.get("server_accepted_per_pos") or [] for x in res]),
            "requests": sum(x["requests"] for x in res)}
