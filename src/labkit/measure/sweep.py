"""The k sweep: tok/s and acceptance for every (drafter, workload, prompt, k, temperature).

One row per generation. For each prompt, runs are interleaved: every run visits the
plain baseline (k = 0, shared by all drafters) and each (drafter, k) once, in a fresh
random order, so drift on a shared machine spreads evenly over the arms. Run 0 of each
prompt is the cold run (first after load, or first on this prompt): one plain generation,
kept and marked ``cold`` (the latency table's cold TTFT), left out of the warm statistics.
It used to run every arm, all of it left out: a third of a two-round sweep's measuring.
In LAB:02-9c2470-b9iet (30 prompt-arm pairs) a cold generation's decode tok/s was 1.3%
below its two warm rounds' mean on average (sd 6.4%, against 4.7% between the two warm
rounds); by arm -2.5% plain, -2.8% A/A, +1.4% n-gram, by prompt up to -8%: what needs
warming is the prompt, once, not each arm.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from labkit.analysis.decide import AA
from labkit.analysis.lossless import divergence_report
from labkit.analysis.stats import summarize, tokens_from
from labkit.decoding.loop import run
from labkit.measure import arms, order
from labkit.measure.policy_arm import arms_only

ROW_KEYS = (
    "decode_tok_s", "e2e_tok_s", "ttft_ms", "ttlt_ms", "tokens", "decode_tokens", "steps", "spec_steps",
    "plain_steps", "drafted", "accepted", "acceptance", "acceptance_tested", "mean_accepted", "tokens_per_step",
    "draft_ms", "verify_ms", "accept_ms", "decode_ms", "rejected_ms", "rejected_share", "repetition",
)


def _row(recs, k_max: int) -> dict:
    s = summarize(recs, k_max=k_max)
    row = {key: getattr(s, key) for key in ROW_KEYS}
    row["gate_events"] = len(s.gate_events)
    row["gate_closed"] = sum(1 for e in s.gate_events if e["event"].startswith("closed"))
    row["accept_by_pos"] = s.accept_by_pos
    row["drafts_reaching_pos"] = s.drafts_reaching_pos
    # per-position counts, so pooled rates can be recomputed exactly later
    spec = [r for r in recs if r.mode != "prefill" and r.drafted > 0]
    row["acc_pos"] = [sum(1 for r in spec if len(r.outcomes) > i and r.outcomes[i] == 1) for i in range(k_max)]
    row["tested_pos"] = [sum(1 for r in spec if len(r.outcomes) > i and r.outcomes[i] >= 0) for i in range(k_max)]
    steps = [r for r in recs if r.mode != "prefill" and getattr(r, "policy_j", None) is not None]
    if steps:  # a policy arm: the j it chose at each step, and its predicted acceptance where it drafted
        row["policy_js"] = [int(r.policy_j) for r in steps]
        row["policy_accepted"] = [int(r.accepted) for r in steps]
        row["policy_preds"] = [round(float(x), 4) for r in steps for x in (r.policy_pred or [])[: int(r.policy_j)]]
    return row


def k_sweep(
    engine,
    prompts: list,
    *,
    drafters: dict,
    ks: list[int],
    runs: int = 3,
    max_tokens: int = 128,
    temperatures: tuple[float, ...] = (0.0,),
    seed: int = 0,
    make_gate: Callable | None = None,
    interleave: str = order.DEFAULT_POLICY,
    check_lossless: bool = True,
    cold_round: bool = True,
    progress: Callable | None = None,
    on_arm: Callable | None = None,
    skip: dict | None = None,
    key_prefix: str = "",
    control: bool = False,
    first_round: int | None = None,
    policies: dict | None = None,
    arm_list: list[tuple[str, int]] | None = None,
) -> pd.DataFrame:
    """Measure every arm on every prompt; ``prompts`` are ``workloads.Prompt`` objects.

    ``make_gate`` (a factory; None = no gate) is applied to every speculative arm.
    ``on_arm`` and ``skip`` journal and resume arms (see ``measure.arms``); an arm is one
    generation, keyed ``[key_prefix~]prompt~T~round~drafter~k``. A resumed call measures
    only the arms not in ``skip``, in the same interleaved order, after one unrecorded
    warm-up generation (the first generation after loading is cold). ``cold_round=False``
    leaves out round 0 (for a call whose prompts this engine has just run at this temperature,
    e.g. the n_max protocol's later steps): only the ``runs`` warm rounds are measured.
    ``first_round`` measures rounds first_round..runs only (sequential measuring adds one
    round at a time); ``control`` adds the A/A arm (drafter ``"aa"``, k 0: a second plain
    arm, interleaved like the others, so plain vs plain is judged with the same machinery).
    ``arm_list`` names the speculative (drafter, k) arms to measure instead of every
    drafter at every k of ``ks`` (the search measures a few chosen settings per workload).
    """
    spec_ks = [k for k in ks if k > 0]
    # policy arms (``measure.policy_arm``): "<drafter>+<policy>" at the policy's k_max, no gate
    policies = arms_only(policies or {})
    fixed = [(d, int(k)) for d, k in arm_list] if arm_list is not None else [(d, k) for d in drafters for k in spec_ks]
    arm_set = ([("none", 0)] + ([(AA, 0)] if control else []) + fixed
               + [(name, int(kmax)) for name, (_, _, kmax) in policies.items()])
    k_rows = max([*ks, *(k for _, k in fixed), *(int(kmax) for _, _, kmax in policies.values())])

    def arm_key(p, temp, r, name, k):
        return arms.key(*([key_prefix] if key_prefix else []), p.id, f"T{temp:g}", f"r{r}", name, f"k{k}")

    schedule = []  # (prompt, temperature, round, round index, the round's arms in order)
    start = first_round if first_round is not None else (0 if cold_round else 1)
    done = (start - 1) * len(prompts) * len(temperatures) if start > 1 else 0  # a fresh order per added round
    for p in prompts:
        for temp in temperatures:
            for r in range(start, runs + 1):
                ordered = order.arm_order(arm_set, done, policy=interleave, seed=seed) if r else [("none", 0)]
                schedule.append((p, temp, r, ordered))  # r = 0: the cold run, plain, once
                done += 1
    arms.plan(on_arm, [arm_key(p, t, r, n, k) for p, t, r, ordered in schedule for n, k in ordered])
    rows = []
    n_total = len(schedule)
    restored_any, warmed = False, False
    ids_of = {}
    for i, (p, temp, r, ordered) in enumerate(schedule):
        ids = ids_of.setdefault(p.id, list(p.ids) if getattr(p, "ids", None) else engine.tokenize(p.text))  # SYNTHETIC prompts carry ids
        s = seed + r if temp > 0 else seed
        for name, k in ordered:
            akey = arm_key(p, temp, r, name, k)
            got = arms.restored(skip, akey)
            if got is not None:
                row, recs = got
                row["_records"] = recs
                rows.append(row)
                restored_any = True
                continue
            if restored_any and not warmed:  # resuming: the box and engine are cold again
                run(engine, ids, max_tokens=max_tokens, temperature=0.0, seed=s)
                warmed = True
            pol = None
            if name in policies:
                d_name, make_policy, _ = policies[name]
                drafter, pol, gate = drafters[d_name], make_policy(), None
            else:
                drafter = drafters.get(name)
                gate = make_gate() if (make_gate and k > 0) else None
            recs = run(engine, ids, drafter=drafter, k=k, max_tokens=max_tokens, temperature=temp,
                       seed=s, gate=gate, policy=pol)
            row = {"workload": p.workload, "prompt": p.id, "drafter": name, "k": k,
                   "temperature": temp, "run": r, "cold": r == 0, "prompt_tokens": len(ids),
                   "gate": gate.threshold if gate else 0.0, "interleave": interleave,
                   **({"policy": pol.name} if pol is not None else {}), **_row(recs, k_rows)}
            arms.finished(on_arm, akey, row, recs)
            row["_records"] = recs
            rows.append(row)
        if progress:
            progress(f"k sweep: {p.id} T={temp} run {r}/{runs} ({i + 1}/{n_total})")
        last_of_group = i + 1 == n_total or (schedule[i + 1][0].id, schedule[i + 1][1]) != (p.id, temp)
        if check_lossless and temp == 0 and last_of_group:
            _lossless(engine, ids, [x for x in rows if x["prompt"] == p.id and x["temperature"] == 0])
    for x in rows:
        x.pop("_records", None)
    return pd.DataFrame(rows)


def _lossless(engine, ids, rows) -> None:
    """Greedy speculative output vs the plain output of the same prompt (first warm plain run)."""
    ref = next(x for x in rows if x["k"] == 0 and x["drafter"] == "none" and not x["cold"])["_records"]
    ref_tokens = tokens_from(ref)
    for x in rows:
        if x["k"] == 0:
            x["lossless"], x["identical"], x["divergence_gap"] = True, tokens_from(x["_records"]) == ref_tokens, None
            continue
        rep = divergence_report(engine, ids, ref, x["_records"])
        x["lossless"], x["identical"] = rep["lossless"], rep["identical"]
        x["divergence_gap"] = rep["divergence"]["plain_gap"] if rep["divergence"] and "plain_gap" in rep[
            "divergence"] else None


def gated_sweep(engine, prompts: list, *, drafters: dict, default_k: pd.DataFrame, make_gate: Callable,
                **kw) -> pd.DataFrame | None:
    """The global-default (drafter, k) of each greedy row of ``default_k`` measured again
    with the gate on, against plain on the same prompts; None when no default speculates.
    The sweep has just run these prompts, so there is no cold round: ``runs`` warm rounds."""
    parts = [k_sweep(engine, prompts, drafters={g.drafter: drafters[g.drafter]}, ks=[0, int(g.k)],
                     check_lossless=False, make_gate=make_gate, key_prefix=f"gated-{g.drafter}-k{int(g.k)}",
                     cold_round=False, **kw)
             for g in default_k[default_k["temperature"] == 0].itertuples() if g.k > 0]
    return pd.concat(parts, ignore_index=True) if parts else None
