"""The planner: the §E matrix for a model, a placement and a box, priced from bytes.

One verify of R rows (c streams × m rows each) costs

    V(R) = O                                    fixed per-step overhead of the engine
         + resident bytes / device bandwidth    read once per step, whatever R
         + spilled bytes / host bandwidth       weights on the host (n_gpu_layers, n_cpu_moe)
         + routed experts: E·(1 − (1 − u/E)^R) distinct experts per MoE layer, each read once,
           at the bandwidth of the side it lives on (the coupon collector: the expert term
           grows with rows exactly where the chapter says: on spill-bound MoE layers)
         + compute: active parameters per row × (t1 for the first row, + t_batch once R ≥ 2 (a
           batch runs other kernels than a one-row product), + t_row per further row), + t_odd
           × the weights every row meets when R is odd and ≥ 3 (the CPU's row-pair kernels);
           rows 2..R in two op classes where the profile measured them apart: the head (an
           output matrix the CPU backend leaves unrepacked, ``head_params``) at its own
           t_batch, t_row and t_odd, the body (every other weight) at the body's; and for a
           row count the probe measured (2..8), each class's measured extra of R rows over
           one, per parameter, in place of that line (the kernels work in tiles of rows:
           the extra is a staircase in R, which no line through it prices)

and a step at draft length k yields 1 + Σ_{i≤k} p_i tokens, p_i the probability that draft
position i is accepted (non-increasing in i). Plain decoding is V(1) per token. Everything
here is arithmetic on a ``ModelProfile`` (the GGUF header) and a machine profile (a dict:
``host``/``device`` bandwidths and compute rates, ``overhead_ms``); measuring lives in
``measure.machine``, drawing in ``report.plan_tables``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from labkit.errors import LabkitError

if TYPE_CHECKING:  # analysis never imports artifacts: the profile arrives as an object
    from labkit.artifacts.gguf_profile import ModelProfile

DENSE = ("attention", "ffn_dense", "ffn_shared", "router", "norms")  # gguf_profile.CATEGORIES but experts
TERMS = {"overhead": "fixed per-step overhead", "device_read": "resident weights read (device)",
         "host_read": "spilled dense weights read (host)", "host_experts": "spilled expert reads (host)",
         "device_experts": "expert reads (device)", "compute": "per-row compute", "draft": "draft cost D"}


def distinct_experts(n_expert: int, n_used: int, rows: float) -> float:
    """Expected distinct experts of one MoE layer touched by ``rows`` rows, each routed to
    ``n_used`` of ``n_expert`` uniformly: E·(1 − (1 − u/E)^rows); at most E."""
    if n_expert <= 0 or n_used <= 0 or rows <= 0:
        return 0.0
    return n_expert * (1.0 - (1.0 - n_used / n_expert) ** rows)


@dataclass(frozen=True)
class Placement:
    gpu_layers: int = 0  # trunk layers on the device, counted from the last (llama.cpp); n_layer + 1: output too
    n_cpu_moe: int = 0  # expert tensors of the first N layers kept on the host

    def label(self) -> str:
        return f"gpu-layers {self.gpu_layers}, n-cpu-moe {self.n_cpu_moe}"


def check_placement(model: ModelProfile, machine: dict, p: Placement) -> None:
    """Bad placements as errors that say how to fix them."""
    if p.gpu_layers < 0 or p.n_cpu_moe < 0:
        raise LabkitError(f"a negative layer count in {p.label()}", "use 0 or more layers")
    if p.gpu_layers > model.n_layer + 1:
        raise LabkitError(f"--gpu-layers {p.gpu_layers} is more than the model has ({model.n_layer} layers, "
                          f"{model.n_layer + 1} with the output layer)", f"use --gpu-layers 0..{model.n_layer + 1}")
    if p.n_cpu_moe and not model.moe:
        raise LabkitError(f"--n-cpu-moe {p.n_cpu_moe} on a dense model ({model.architecture}: no routed experts)",
                          "drop --n-cpu-moe (or set it to 0); spill a dense model with --gpu-layers")
    if p.n_cpu_moe > model.n_layer:
        raise LabkitError(f"--n-cpu-moe {p.n_cpu_moe} is more than the model's {model.n_layer} layers",
                          f"use --n-cpu-moe 0..{model.n_layer}")
    if p.gpu_layers and not machine.get("device"):
        why = machine.get("device_note") or "the profile has no accelerator"
        raise LabkitError(f"--gpu-layers {p.gpu_layers} needs an accelerator, but {why}",
                          "use --gpu-layers 0 on this host, or --profile a profile with a device "
                          "(e.g. one from data/published/)")


def spilled_layers(model: ModelProfile, p: Placement) -> int:
    """Trunk layers with any weights on the host (the chapter's 'layers spilled')."""
    on_dev = min(p.gpu_layers, model.n_layer)
    return sum(1 for i in range(model.n_layer) if i < model.n_layer - on_dev or (model.moe and i < p.n_cpu_moe))


def _rate(side: dict, key: str) -> float:
    return float(side.get(key) or 0.0)


def active_params_by_side(model: ModelProfile, p: Placement) -> dict:
    """Parameters one row multiplies by on each side ("host", "device") at placement ``p``."""
    return verify_terms(model, {"host": {"bandwidth_gbs": 1.0}, "device": {"bandwidth_gbs": 1.0}}, p, 1)["active"]


def head_params(model: ModelProfile) -> float:
    """Parameters of the output head priced as its own class on a CPU: a tied output (the
    token embedding, e.g. gemma-3's 262,144 × 640) stays in the mapped buffer the embedding
    lookup reads, so ggml never repacks it for batched products, and its rows beyond the first
    run other kernels than the repacked body's. An untied output is repacked like the body: 0."""
    return float(model.output_elements) if model.output_tied else 0.0


def verify_terms(model: ModelProfile, machine: dict, p: Placement, rows: float) -> dict:
    """ms per term of one decode of ``rows`` rows (see the module doc); ``ms`` is their sum."""
    host, dev = machine["host"], machine.get("device") or {}
    on_dev_from = model.n_layer - min(p.gpu_layers, model.n_layer)
    t = dict.fromkeys(("device_read", "host_read", "host_experts", "device_experts", "compute"), 0.0)
    active = {"host": 0.0, "device": 0.0}  # parameters one row multiplies by, per side
    dense = {"host": 0.0, "device": 0.0}  # of which outside routed experts (row-pair kernels see all rows)
    E, u = model.n_expert, model.n_expert_used
    k_distinct = distinct_experts(E, u, rows)
    for i, lay in enumerate(model.trunk):
        dev_layer = i >= on_dev_from
        side = "device" if dev_layer else "host"
        dense_b = sum(lay.bytes[c] for c in DENSE)
        t["device_read" if dev_layer else "host_read"] += dense_b
        active[side] += sum(lay.elements[c] for c in DENSE)
        dense[side] += sum(lay.elements[c] for c in DENSE)
        if lay.bytes["experts"] and E:
            eside = "host" if (not dev_layer or i < p.n_cpu_moe) else "device"
            t[f"{eside}_experts"] += k_distinct * lay.bytes["experts"] / E
            active[eside] += u * lay.elements["experts"] / E
    out_dev = p.gpu_layers > model.n_layer
    t["device_read" if out_dev else "host_read"] += model.output_bytes
    active["device" if out_dev else "host"] += model.output_elements
    dense["device" if out_dev else "host"] += model.output_elements
    for k in ("device_read", "device_experts"):
        t[k] = t[k] / (_rate(dev, "bandwidth_gbs") * 1e6) if t[k] else 0.0
    for k in ("host_read", "host_experts"):
        t[k] = t[k] / (_rate(host, "bandwidth_gbs") * 1e6) if t[k] else 0.0
    odd = 1.0 if rows >= 3 and int(round(rows)) % 2 == 1 else 0.0
    # the head as its own class: on the host, where the profile measured its rates apart
    head = head_params(model) if not out_dev and host.get("head_row_ns_per_param") is not None else 0.0
    for name, side in (("host", host), ("device", dev)):
        if active[name]:
            h = head if name == "host" else 0.0
            t["compute"] += active[name] * _rate(side, "matvec_ns_per_param") * 1e-6
            t["compute"] += _rows_extra(side, "", active[name] - h, dense[name] - h, rows, odd)
            if h:
                t["compute"] += _rows_extra(side, "head_", h, h, rows, odd)
    t["overhead"] = float(machine.get("overhead_ms") or 0.0)
    t["ms"] = sum(t.values())
    t["active"] = active
    return t


def _rows_extra(side: dict, cls: str, params: float, dense: float, rows: float, odd: float) -> float:
    """ms the rows beyond the first add for ``params`` parameters of one op class (``cls``:
    "" the body, "head_" the head): the measured per-m table where it has this row count,
    else the line (t_batch + (R − 1)·t_row) and the odd-row extra on the ``dense`` part."""
    if rows < 2 or not params:
        return 0.0
    table = side.get(f"{cls}rows_ns_per_param_by_m") or {}
    key = str(int(rows)) if float(rows).is_integer() else None
    if key in table:
        return params * float(table[key]) * 1e-6
    per = (rows - 1) * _rate(side, f"{cls}row_ns_per_param") + _rate(side, f"{cls}batch_ns_per_param")
    # an odd row count costs extra where every row meets the same weights (a routed expert
    # sees ~rows·u/E rows, so the row-pair kernels' odd one out is not its cost)
    return (params * per + dense * odd * _rate(side, f"{cls}odd_ns_per_param")) * 1e-6


def verify_ms(model: ModelProfile, machine: dict, p: Placement, rows: float) -> float:
    return verify_terms(model, machine, p, rows)["ms"]


# -- acceptance -----------------------------------------------------------------------------
def check_acceptance(p: list[float], *, what: str = "--acceptance") -> list[float]:
    """Per-position acceptance p_i = P(draft position i is accepted): each in [0, 1], never
    rising with i (position i can only be accepted when every earlier one was)."""
    p = [float(x) for x in p]
    if not p:
        raise LabkitError(f"{what} is empty", "give one value per draft position, e.g. --acceptance 0.85,0.7,0.59")
    for i, x in enumerate(p, 1):
        if not 0.0 <= x <= 1.0:
            raise LabkitError(f"{what}: position {i} is {x}, outside [0, 1]",
                              "acceptance is a probability: use values between 0 and 1 (0.85, not 85)")
    for i in range(1, len(p)):
        if p[i] > p[i - 1] + 1e-12:
            raise LabkitError(f"{what}: position {i + 1} ({p[i]}) is above position {i} ({p[i - 1]}); a per-position "
                              "profile cannot rise (a later draft is accepted only after every earlier one)",
                              "give P(position i accepted) per position, non-increasing, e.g. 0.85,0.7,0.59")
    return p


def pooled_positions(per_run, steps: float, k: int) -> list[float]:
    """P(draft position i accepted in a step), i = 1..k, pooled over runs: ``per_run`` holds each
    run's count of steps that accepted position i (a sweep's ``acc_pos``), ``steps`` the decode
    steps of all of them. Non-increasing by construction; the clamp only removes float dust."""
    p = [sum(int(a[i]) for a in per_run if a is not None and len(a) > i) / steps for i in range(k)]
    return [min(p[: i + 1]) for i in range(k)]


def from_first_token(first: float, k: int) -> list[float]:
    """A per-position profile from first-token acceptance alone, positions independent: a^i."""
    return [first ** (i + 1) for i in range(k)]


def tokens_per_step(p: list[float], k: int) -> float:
    if k > len(p):
        raise LabkitError(f"the acceptance profile has {len(p)} positions; n_max {k} needs {k}",
                          f"give {k} per-position values, or plan --n-max up to {len(p)}")
    return 1.0 + sum(p[:k])


# -- drafters -------------------------------------------------------------------------------
def draft_ms(kind: str, k: int, *, model: ModelProfile, machine: dict, p: Placement, rows: float = 1,
             draft: ModelProfile | None = None) -> float:
    """D for one step of k drafts at ``rows`` streams: n-gram ~0; MTP: the nextn blocks (with
    the output matrix) once per draft token; a draft model: its own one-row step per token."""
    if k == 0 or kind == "ngram":
        return 0.0
    if kind == "mtp":
        if not model.n_nextn:
            raise LabkitError(f"{model.architecture} has no nextn (MTP) layers", "use --drafter ngram or model")
        frac = model.nextn_bytes / max(1, sum(sum(lay.bytes.values()) for lay in model.trunk) + model.output_bytes)
        return k * (float(machine.get("overhead_ms") or 0.0) + frac * verify_terms(model, machine, p, rows)["ms"]
                    + model.output_bytes / (_rate((machine.get("device") if p.gpu_layers > model.n_layer else None)
                                                   or machine["host"], "bandwidth_gbs") * 1e6))
    if kind == "model":
        if draft is None:
            raise LabkitError("--drafter model needs the draft model's GGUF", "pass --draft-model PATH.gguf")
        dp = Placement(gpu_layers=min(p.gpu_layers, draft.n_layer + 1) if machine.get("device") else 0)
        return k * verify_ms(draft, machine, dp, rows)
    raise LabkitError(f"unknown drafter {kind!r} for the planner", "use --drafter ngram, mtp or model")


# -- the plan -------------------------------------------------------------------------------
def _spec_terms(model, machine, p, c: int, k: int, len_ge: list[float] | None) -> dict:
    """The verify terms of a step at n_max k: always k drafts, or (``len_ge``: P(draft length
    >= i), i = 1..k, as an n-gram drafter that finds no match drafts fewer) their expectation."""
    if not len_ge:
        return verify_terms(model, machine, p, c * (k + 1))
    ge = [1.0, *[float(x) for x in len_ge[:k]], 0.0]
    out: dict = {}
    for j in range(k + 1):  # P(length = j) * V(c * (j + 1))
        w = ge[j] - ge[j + 1] if j < k else ge[k]
        t = verify_terms(model, machine, p, c * (j + 1))
        for key, v in t.items():
            if key != "active":
                out[key] = out.get(key, 0.0) + w * v
    return out


def cell(model: ModelProfile, machine: dict, p: Placement, k: int, acc: list[float], *, c: int = 1,
         drafter: str = "ngram", draft: ModelProfile | None = None, len_ge: list[float] | None = None) -> dict:
    """One §E/§B cell: plain and speculative tok/s (aggregate over c streams), the speedup, the
    terms of the speculative step, and the dominant term of what speculation adds. ``len_ge``:
    the drafter's draft-length distribution where it does not always draft k (default: it does)."""
    plain = verify_terms(model, machine, p, c)
    base = 1e3 * c / plain["ms"]
    if k == 0:
        return {"n_max": 0, "c": c, "tok_s": base, "baseline_tok_s": base, "speedup": 1.0, "tokens_per_step": 1.0,
                "first_token_acceptance": None, "V_ms": plain["ms"], "D_ms": 0.0, "H_ms": plain["ms"] / c,
                "dominant": None, **{f"plain_{t}_ms": plain[t] for t in TERMS if t in plain}}
    spec = _spec_terms(model, machine, p, c, k, len_ge)
    D = draft_ms(drafter, k, model=model, machine=machine, p=p, rows=c, draft=draft)
    tok = tokens_per_step(acc, k)
    tok_s = 1e3 * c * tok / (spec["ms"] + D)
    added = {t: spec[t] - plain[t] for t in TERMS if t in spec}  # what the extra rows add, per term
    added["draft"] = D
    dom = max(added, key=added.get)
    return {"n_max": k, "c": c, "tok_s": tok_s, "baseline_tok_s": base, "speedup": tok_s / base,
            "tokens_per_step": tok, "first_token_acceptance": acc[0], "V_ms": spec["ms"], "D_ms": D,
            "H_ms": plain["ms"] / c, "dominant": TERMS[dom],
            **{f"added_{t}_ms": v for t, v in added.items()}}


def plan(model: ModelProfile, machine: dict, *, placements: list[Placement], n_max: list[int], acceptance: list[float],
         cs: list[int] = (1,), drafter: str = "ngram", draft: ModelProfile | None = None) -> dict:
    """§E (c = 1: each placement × n_max) and §B (each c × n_max at the first placement),
    and where the verdict flips along the spill axis."""
    acc = check_acceptance(acceptance)
    for p in placements:
        check_placement(model, machine, p)
    e_rows = []
    for p in placements:
        for k in n_max:
            e_rows.append({"placement": p.label(), "gpu_layers": p.gpu_layers, "n_cpu_moe": p.n_cpu_moe,
                           "spilled_layers": spilled_layers(model, p),
                           **cell(model, machine, p, k, acc, drafter=drafter, draft=draft)})
    b_rows = [{"placement": placements[0].label(), **cell(model, machine, placements[0], k, acc, c=c, drafter=drafter,
                                                           draft=draft)} for c in cs for k in n_max]
    return {"E": e_rows, "B": b_rows, "flips": flips(model, machine, placements[0], n_max=n_max, acceptance=acc,
                                                     drafter=drafter, draft=draft)}


def spill_axis(model: ModelProfile, machine: dict, base: Placement) -> list[tuple[int, Placement]]:
    """(spilled layers, placement) from no spill to all spilled, along the axis this box has:
    n_cpu_moe for a MoE with a device, GPU layers for a dense model with a device, none on a host
    without one (everything is on the host)."""
    n = model.n_layer
    if not machine.get("device"):
        return [(n, Placement(0, 0))]
    if model.moe:
        return [(s, Placement(n + 1, s)) for s in range(n + 1)]
    return [(s, Placement(n + 1 - s if s == 0 else n - s, 0)) for s in range(n + 1)]


def flips(model: ModelProfile, machine: dict, base: Placement, *, n_max: list[int], acceptance: list[float],
          drafter: str = "ngram", draft: ModelProfile | None = None) -> list[dict]:
    """Per n_max: the speedup along the spill axis and the sentence saying where it stops paying."""
    axis = spill_axis(model, machine, base)
    out = []
    for k in [x for x in n_max if x > 0]:
        sp = [(s, cell(model, machine, p, k, acceptance, drafter=drafter, draft=draft)["speedup"]) for s, p in axis]
        pays = [s for s, x in sp if x > 1.0]
        if len(axis) == 1:
            text = (f"n_max={k}: {sp[0][1]:.2f}× with every layer on the host (no device in this profile), "
                    + ("pays" if pays else "does not pay"))
        elif not pays:
            text = f"n_max={k} does not pay at any placement (best {max(x for _, x in sp):.2f}×)"
        elif len(pays) == len(sp):
            text = f"n_max={k} pays at every placement, even with all {model.n_layer} layers spilled"
        else:
            edge = max(pays)
            what = "layers of experts spill" if model.moe else "layers spill to the host"
            text = f"n_max={k} pays when at most {edge} {what} (at {edge + 1}: {dict(sp)[edge + 1]:.2f}×)"
        out.append({"n_max": k, "text": text, "axis": [{"spilled_layers": s, "speedup": x} for s, x in sp]})
    return out
