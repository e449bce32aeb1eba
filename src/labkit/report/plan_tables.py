"""What `labkit plan` and notebook 08 show: the planned §E and §B tables, the check against
measurement, the planner beside published numbers, and the speedup-vs-spill figure.

Tables are tidy numeric frames (logged as they are); ``human`` turns a plan into the lines a
terminal prints. Acceptance can come from a logged k sweep (``acceptance_from_lab``): the
probability that draft position i is accepted in a step, pooled over the sweep's warm greedy
runs at its largest k; or from the same sweep's replay of its plain runs
(``acceptance_from_replay``), which reaches every k replayed without measuring it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from labkit.analysis import plan
from labkit.errors import LabkitError
from labkit.provenance import tracking
from labkit.provenance.ids import parse_id
from labkit.report import evidence

PUBLISHED_COLUMNS = ["source", "row", "n_max", "published_tok_s", "predicted_tok_s", "tok_s_error",
                     "published_speedup", "predicted_speedup", "speedup_error", "acceptance", "sign_match",
                     "row_winner_published", "row_winner_predicted", "winner_match", "dominant",
                     "host_row_ns_per_param", "host_row_source"]


def acceptance_from_lab(c, text: str, *, drafter: str = "ngram", temperature: float = 0.0) -> dict:
    """Per-position acceptance from the 02_k_sweep run (or its sweep-runs table) ``text`` names."""
    lab = parse_id(text)
    run = tracking.find_run(c, lab.run)
    rows = evidence.table_or_none(c, run, "sweep-runs")
    if rows is None:
        raise LabkitError(f"{text} has no sweep-runs table to read acceptance from",
                          "name a 02_k_sweep run (labkit show lists its tables), or give --acceptance 0.85,0.7,0.59")
    rows = rows[(rows["drafter"] == drafter) & (rows["temperature"] == temperature) & (~rows["cold"].astype(bool))]
    if rows.empty:
        raise LabkitError(f"{text} has no warm {drafter} runs at temperature {temperature:g}",
                          "pick the drafter it measured (--drafter), or give --acceptance values")
    top = rows[rows["k"] == rows["k"].max()]
    k = int(top["k"].iloc[0])
    steps = float(top["steps"].sum())
    p = plan.pooled_positions(top["acc_pos"], steps, k)
    return {"p": p, "source": str(lab), "k_max": k, "steps": int(steps), "drafter": drafter}


def acceptance_from_replay_rows(pred: pd.DataFrame, *, drafter: str = "ngram", source: str = "") -> dict:
    """Per-position acceptance from 02's replay of its plain runs (the "replay-prediction"
    table: every prompt's plain greedy output replayed at each k, no target involved): at the
    largest k replayed for ``drafter``, P(position i accepted in a step) = steps that accepted
    position i / decode steps, pooled over prompts. The same denominator as a measured sweep."""
    if pred is None or pred.empty or "pred_acc_pos" not in pred:
        raise LabkitError(f"{source or 'this run'} has no replayed acceptance by position (pred_acc_pos)",
                          "rerun 02_k_sweep (runs logged before the planner read replays lack it), or give "
                          "--acceptance LAB:02-… (the measured sweep) or per-position values")
    g = pred[pred["drafter"] == drafter]
    if g.empty:
        raise LabkitError(f"{source or 'this run'} replayed no {drafter} drafts (it replayed: "
                          f"{sorted(pred['drafter'].unique())})", "pick one of those with --drafter")
    top = g[g["k"] == g["k"].max()]
    k, steps = int(top["k"].iloc[0]), float(top["pred_steps"].sum())
    if not steps:
        raise LabkitError(f"{source or 'this run'}'s replay at k={k} has no decode steps", "replay longer outputs")
    p = plan.pooled_positions(top["pred_acc_pos"], steps, k)
    return {"p": p, "source": f"replay of {source}" if source else "replay", "k_max": k, "steps": int(steps),
            "drafter": drafter, "prompts": int(top["prompt"].nunique()) if "prompt" in top else None}


def acceptance_from_replay(c, text: str, *, drafter: str = "ngram") -> dict:
    """``acceptance_from_replay_rows`` of the 02_k_sweep run ``text`` names (``replay:LAB:…``)."""
    lab = parse_id(text)
    run = tracking.find_run(c, lab.run)
    return acceptance_from_replay_rows(evidence.table_or_none(c, run, "replay-prediction"), drafter=drafter,
                                       source=str(lab))


def e_table(res: dict) -> pd.DataFrame:
    cols = ["placement", "spilled_layers", "n_max", "tok_s", "speedup", "first_token_acceptance", "tokens_per_step",
            "baseline_tok_s", "V_ms", "D_ms", "H_ms", "dominant"]
    return pd.DataFrame(res["E"])[cols]


def b_table(res: dict) -> pd.DataFrame:
    cols = ["placement", "c", "n_max", "tok_s", "speedup", "baseline_tok_s", "V_ms", "D_ms", "dominant"]
    return pd.DataFrame(res["B"])[cols]


def axis_table(res: dict) -> pd.DataFrame:
    """Predicted speedup per (n_max, spilled layers): the figure's lines."""
    return pd.DataFrame([{"n_max": f["n_max"], **a} for f in res["flips"] for a in f["axis"]])


def _cell(r) -> str:
    acc = "" if r["n_max"] == 0 else f" @ {r['first_token_acceptance']:.0%}"
    return f"{r['tok_s']:.1f} ({r['speedup']:.2f}×){acc}"


def human(res: dict, *, model: dict, machine: dict) -> list[str]:
    """The plan as terminal lines: what was planned, §E, §B, where it flips, what it left out."""
    host = (machine.get("host_fingerprint") or {}).get("label") or machine.get("name") or "a stated profile"
    lines = [f"plan: {model['architecture']}, {model['n_layer']} layers"
             + (f", {model['n_expert']} experts (top-{model['n_expert_used']})" if model["n_expert"] else ", dense")
             + f", {model['total_bytes'] / 1e9:.2f} GB; box: {host}, host {machine['host']['bandwidth_gbs']:.1f} GB/s, "
             + (f"device {machine['device']['bandwidth_gbs']:.0f} GB/s" if machine.get("device")
                else machine.get("device_note") or "no device"),
             "PREDICTED, not measured: each cell tok/s (× vs plain) @ first-token acceptance", ""]
    e = pd.DataFrame(res["E"])
    lines.append("§E  placement                      spilled  " + "  ".join(f"n_max={k:<14}" for k in
                                                                         sorted(e["n_max"].unique())))
    for (pl, sp), g in e.groupby(["placement", "spilled_layers"], sort=False):
        lines.append(f"    {pl:<30} {sp:>7}  " + "  ".join(f"{_cell(r):<20}" for _, r in g.iterrows()))
    b = pd.DataFrame(res["B"])
    if b["c"].nunique() > 1:
        lines += ["", f"§B  at {b['placement'].iloc[0]}: aggregate tok/s over c streams"]
        for c, g in b.groupby("c"):
            lines.append(f"    c={c:<3} " + "  ".join(f"n_max={r['n_max']}: {r['tok_s']:.1f} ({r['speedup']:.2f}×)"
                                                   for _, r in g.iterrows()))
    spec = e[e["n_max"] > 0]
    if not spec.empty:
        worst = spec.loc[spec["speedup"].idxmin()]
        lines += ["", f"dominant term where it pays least ({worst['placement']}, n_max={worst['n_max']}): "
                      f"{worst['dominant']}"]
    lines += [f"flip: {f['text']}" for f in res["flips"]]
    lines += [f"note: {w}" for w in model.get("warnings", [])]
    line = record_line(machine)
    if line:
        lines.append(line)
    return lines


def record_line(machine: dict) -> str | None:
    """How right this box's plans have been, as one phrase from the profile's residual
    (``labkit plan --check``); None for a stated profile (not measured here, never checked)."""
    r = machine.get("residual")
    if not r:
        return "this box's record: never checked; run labkit plan --check" if machine.get("kind") == "measured" else None
    when = str(r.get("checked_at", "")).replace("T", " ").replace("Z", " UTC")
    s = (f"this box's record: verify(m) predicted within {r['verify_median_abs_error']:.0%} median absolute error "
         f"on {r['models']} models (out of sample {r['verify_median_abs_error_out_of_sample']:.0%})")
    flushed = r.get("per_model_flushed") or {}
    synth = [v for m, v in flushed.items() if m.startswith("synthetic")]
    if synth:
        s += (f"; the SYNTHETIC models that fit in this box's cache, measured with it flushed: within "
              f"{float(np.median(synth)):.0%}")
    if r.get("speedup_median_abs_error") is not None:
        s += f"; speedup within {r['speedup_median_abs_error']:.0%}"
    s += f" (labkit plan --check, {when}"
    return s + (f"; {r['note']})" if r.get("note") else ")")


def published_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)[PUBLISHED_COLUMNS]


POST_PROSE = [0.85, 0.72, 0.59]  # the post's prose acceptance (data/published/seeds.yaml), k=2 interpolated


def acceptance_for(c, recipe) -> dict:
    """Per-position acceptance for a plan of ``recipe``'s model: its newest 02_k_sweep (first of the
    recipe's drafters with warm greedy runs; else that sweep's replay of its plain runs), else
    the post's prose profile, labelled as such."""
    s = evidence.sweep(c, recipe)
    if s.rows is not None and s.id:
        for d in recipe.drafters:
            try:
                return {**acceptance_from_lab(c, s.id, drafter=d), "why": f"measured by {s.id}"}
            except LabkitError:
                continue
        for d in recipe.drafters:
            try:
                return {**acceptance_from_replay(c, s.id, drafter=d), "why": f"replayed by {s.id} (no warm runs)"}
            except LabkitError:
                continue
    why = s.why or "the newest sweep has no warm greedy runs"
    return {"p": POST_PROSE, "source": "assumed: the post's prose profile (data/published/seeds.yaml)",
            "drafter": "ngram", "why": why}


def published_points(cells: list[dict]) -> list[dict]:
    """The chapter's spilled §E cells as figure points (spilled layers, published speedup, n_max)."""
    return [{"spilled_layers": c["spilled_layers"], "speedup": c["published_speedup"], "n_max": c["n_max"]}
            for c in cells if c["spilled_layers"] > 0]
