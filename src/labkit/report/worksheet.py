"""The chapter's two worksheets, from logged runs only.

The **accounting table** has one row per item with Baseline (speculation off) /
Candidate / Notes columns and the ``[LAB: …]`` ID behind it. The **short field
worksheet** is its seven-item digest: (1) engine build + model artifact, (2) spill /
n-cpu-moe, (3) n_max off vs candidate with the acceptance at each step, (4) mean accept
length, (5) warm decode tok/s (3 runs, range), (6) tool-suite runs, (7) the keep/reject
decision with its owner. End-to-end speedup, production concurrency (the mandatory
re-bench) and the dominant inequality term live in the accounting table; when the
concurrency re-bench is missing the short form's decision says it is provisional.

Nothing here measures. A field with no run behind it says "no data: <reason>".

Each cell says one thing in at most ``CELL_MAX`` characters: what is the same for baseline
and candidate (the build, the model, where its weights went) is said once, in Baseline,
with Candidate "same as baseline"; long provenance (every build flag, the load-log text)
stays one ``labkit show`` of the cited run away.
"""

from __future__ import annotations

import pandas as pd

from labkit.provenance.metric_keys import canonical_metrics
from labkit.report.queries import NO_DATA

SAME = "same as baseline"  # a candidate cell that would repeat the baseline's
CELL_MAX = 200  # the longest cell the accounting table should have (tests hold a real run's to it)


def decide(cells: pd.DataFrame, pred: pd.DataFrame | None, k_tested: list[int]) -> dict:
    """keep / widen / narrow / disable for the best global default (greedy), with the
    inequality term behind the cells that lose.

    The default is the (drafter, k) with the best geometric-mean speedup over the
    workloads; "narrow" when some workloads lose at that k, "widen" when that k is the
    largest tested, "disable" when no default beats plain decoding.
    """
    from labkit.analysis.sweep_tables import geomean_by_k, global_default

    greedy = cells[cells["temperature"] == 0]
    glob = global_default(greedy)
    if glob.empty:
        return {"decision": NO_DATA.format(why="no speculative cells"), "term": None}
    top = glob.loc[glob["geomean_speedup"].idxmax()]
    drafter, gm = top["drafter"], float(top["geomean_speedup"])
    spec = greedy[(greedy["drafter"] == drafter) & (greedy["k"] > 0)]
    k = int(geomean_by_k(spec).idxmax())
    at_k = spec[spec["k"] == k].set_index("workload")["speedup"]
    winners, losers = sorted(at_k[at_k > 1].index), sorted(at_k[at_k <= 1].index)
    terms = []
    if pred is not None and not pred.empty:
        lose = pred[pred["losing_term"].notna() & (pred["drafter"] == drafter) & (pred["k"] == k)
                    & (pred["temperature"] == 0)]
        terms = [f"{r.workload} k={k}: {r.losing_term}" for r in lose.itertuples()]
        if gm <= 1 and not terms:
            lose = pred[pred["losing_term"].notna() & (pred["temperature"] == 0)]
            terms = [f"{r.drafter} {r.workload} k={r.k}: {r.losing_term}" for r in lose.head(1).itertuples()]
    if gm <= 1:
        decision = "disable: no drafter/k beats plain decoding across the workloads"
    elif losers:
        decision = (f"narrow: {drafter} k={k} for {', '.join(winners)}; disable (or rely on the gate) "
                    f"for {', '.join(losers)}")
    elif k == max(k_tested):
        decision = f"widen: {drafter} k={k} is the largest k tested; measure larger k"
    else:
        decision = f"keep: {drafter} at k={k}"
    return {"decision": decision, "best": {"drafter": drafter, "k": k, "geomean_speedup": gm,
                                           "per_workload": {w: float(v) for w, v in at_k.items()}},
            "term": "; ".join(terms) or None}


ITEMS = (
    "engine build (pinned commit)", "model artifact (path + checksum + quant)", "spill / n-cpu-moe (load log)",
    "n_max (off vs candidate)", "acceptance at each step", "mean accept length", "warm decode tok/s (3 runs, range)",
    "end-to-end speedup (TTLT)", "tool suite runs", "production concurrency (re-bench)",
    "decision (keep/reject, owner)", "dominant inequality term", "energy / CPU time per token",
)
SHORT = (  # the short field worksheet: (item, accounting rows it is drawn from)
    ("1. engine build + model artifact", ITEMS[0:2]),
    ("2. spill / n-cpu-moe (load log)", ITEMS[2:3]),
    ("3. n_max: off vs candidate, acceptance at each step", ITEMS[3:5]),
    ("4. mean accept length", ITEMS[5:6]),
    ("5. warm decode tok/s (3 runs, range)", ITEMS[6:7]),
    ("6. tool suite runs", ITEMS[8:9]),
    ("7. decision keep/reject + owner", ITEMS[10:11]),
)


DECISION_FOR = "decision for "  # the search's rows, one per workload (and the mix), after item 7


def _spread(d: dict | None, unit: str = "", n_key: str = "runs") -> str:
    if not d:
        return ""
    return f"{d['median']:.2f}{unit} (range {d['min']:.2f}-{d['max']:.2f}, {d[n_key]} {n_key})"


def accounting(c, recipe, *, owner: str | None = None) -> list[dict]:
    """The accounting table: one dict per item with baseline, candidate, notes, source."""
    from labkit.report import candidate as cand_mod
    from labkit.report import decision, evidence

    rows: list[dict] = []

    def add(item, baseline, cand, notes="", source=None):
        rows.append({"item": item, "baseline": baseline, "candidate": cand, "notes": notes, "source": source})

    sw = evidence.sweep(c, recipe)
    tools = evidence.newest(c, "04_tool_suite_qc", recipe)
    conc = evidence.newest(c, "07_concurrency", recipe)
    owner = owner or recipe.owner
    if sw.run is None:
        for item in ITEMS:
            add(item, evidence.no_data(sw.why), evidence.no_data(sw.why))
        rows[ITEMS.index("decision (keep/reject, owner)")]["notes"] = (
            f"owner: {owner}" if owner else evidence.no_data("no owner: set recipe field owner or pass --owner"))
        return rows
    t, sid, eng = sw.tags, sw.id, sw.engine
    cand = cand_mod.candidate(c, recipe, sw)
    d, k = cand["drafter"], cand["k"]
    build = eng.get("build", {})
    commit = t.get("engine.commit") or build.get("llama_cpp_commit")
    text = (f"{t.get('engine')} {t.get('engine.version')}" + (f", llama.cpp commit {commit}" if commit else "")
            if t.get("engine") else evidence.no_data("the sweep run has no engine tags"))
    cost = evidence.newest(c, "01_cost_fit", recipe)
    xline = cost.tags.get("crosscheck.line") if cost.run is not None else None
    xcheck = (f"; vs llama-bench: {xline} [{cost.id}]" if xline else
              "; " + evidence.no_data("no llama-bench cross-check (labkit reproduce --only 01)"))
    one = build.get("one_build")
    lib = ("" if one is None else "; one build with the tools" if one
           else f"; NOT one build: {build.get('one_build_why')}")
    patches = f"; {_patches(t['engine.patches'])}" if t.get("engine.patches") else ""
    add(ITEMS[0], text, SAME, f"threads {t.get('engine.threads', '-')}; {_flags(t.get('engine.flags'))}{patches}"
        + lib + xcheck, sid)
    model = eng.get("model") or {}
    path = eng.get("model_path") or model.get("path")
    quant = eng.get("model_desc") or model.get("ftype") or evidence.no_data("no model description")
    art = (f"{path or t.get('model.name')} sha256 {t.get('model.sha256') or model.get('sha256')} ({quant})"
           if t.get("model.sha256") or model.get("sha256") else evidence.no_data("the run recorded no model checksum"))
    draft = (f"; plus draft {t.get('draft.model.name')} sha256 {t.get('draft.model.sha256')}"
             if d == "model" and t.get("draft.model.sha256") else "")
    add(ITEMS[1], art, SAME + draft, "the candidate's drafter is " + (
        "a draft model" if d == "model" else f"{d} (no extra weights)"), sid)
    spill = evidence.residency_text(evidence.json_tag(t, "residency"), build=build)
    add(ITEMS[2], spill, SAME, f"asked n_gpu_layers = {t.get('engine.n_gpu_layers', '-')}", sid)
    policy = (f"; also a candidate, k: auto (priced per step): {t['policy.line']}"
              + (f"; llama-server's closest flags: {t['policy.llama_server_flags']}"
                 if t.get("policy.llama_server_flags") else "")) if t.get("policy.line") else ""
    add(ITEMS[3], "0 (speculation off)", f"{d} n_max={k}", f"chosen by {cand['how']}" + policy,
        cand["source"] or sid)
    rs = sw.rows
    add(ITEMS[4], "-", decision.steps_text(sw.steps, rs, d, sw.stopped) or evidence.no_data("no speculative runs"),
        "stepwise protocol" if sw.steps is not None else "full grid", sid)
    al = decision.accept_length(rs, d, k) if rs is not None else None
    add(ITEMS[5], "1.00 token per step (plain)",
        f"{al['tokens_per_step']:.2f} tokens per step ({al['mean_accepted'] or 0:.2f} accepted drafts per "
        f"drafting step)" if al else evidence.no_data(f"no warm greedy run of {d} n_max={k}"),
        f"acceptance per drafted token {al['acceptance']:.0%}" if al and al["acceptance"] is not None else "", sid)
    base_r, cand_r = (decision.run_tok_s(rs, None, 0), decision.run_tok_s(rs, d, k)) if rs is not None else (None, None)
    few = [x["runs"] for x in (base_r, cand_r) if x and x["runs"] < 3]
    add(ITEMS[6], _spread(base_r, " tok/s") or evidence.no_data("no warm plain run"),
        _spread(cand_r, " tok/s") or evidence.no_data(f"no warm run of {d} n_max={k}"),
        "warm greedy runs, tokens pooled over the prompts of each run" +
        (f"; only {min(few)} warm run(s): the chapter asks for 3" if few else ""), sid)
    margin = getattr(recipe, "decision_margin", 0.02)
    conf = getattr(recipe, "decision_confidence", 0.95)
    e2e = decision.paired_ratio(rs, d, k, "e2e_tok_s", margin=margin, confidence=conf) if rs is not None else None
    dec = decision.paired_ratio(rs, d, k, "decode_tok_s", margin=margin, confidence=conf) if rs is not None else None
    add(ITEMS[7], "1.00×", f"end-to-end {e2e['text']}, {e2e['verdict']}" if e2e else evidence.no_data(
        "no paired runs"), (f"decode-only (prefill left out) {dec['text']}; {e2e['pairs']} pairs" if dec and e2e
                            else ""), sid)
    tool_ok, tool = _toolsuite(tools, cand)
    add(ITEMS[8], tool["baseline"], tool["candidate"], tool["notes"], tools.id)
    *conc_fields, conc_loss = _concurrency(c, conc, recipe)
    add(ITEMS[9], *conc_fields, conc.id)
    lossless = None
    if rs is not None and "lossless" in rs:
        sel = decision._warm(rs, d, k)["lossless"].dropna()
        lossless = bool(sel.all()) if len(sel) else None
    word, why = decision.candidate_verdict(e2e=e2e, decode=dec["ratio"] if dec else None, tool_ok=tool_ok,
                                           lossless=lossless,
                                           concurrency=conc.run is not None and "lab.skipped" not in conc.run.data.tags,
                                           concurrency_loss=conc_loss)
    spec = decision.speculation_words(sw.cells, cand, steps=sw.steps, stopped=sw.stopped,
                                      configured=getattr(recipe, "n_max", None), e2e=e2e) if sw.cells is not None else None
    said = f"{word}: {d} n_max={k}" + (f" ({'; '.join(why)})" if why else "")
    searched = evidence.json_tag(t, "search.decisions")
    if isinstance(searched, list):  # the search decided per workload: its lines follow item 7
        spec_text = "per workload, below"
    # the speculation word in full only where it adds to the decision (not the same CI said twice)
    else:
        spec_text = (spec["text"].split(":")[0] if spec and e2e and e2e["text"] in spec["text"]
                     and e2e["text"] in said else spec["text"] if spec else None)
    add(ITEMS[10], "-", said,
        (f"owner: {owner}" if owner else evidence.no_data("no owner: set recipe field owner or pass --owner"))
        + (f"; speculation: {spec_text}" if spec_text else ""), sid)
    for x in searched if isinstance(searched, list) else []:
        add(f"{DECISION_FOR}{x['workload']}", "off", x["line"],
            f"llama-server: {x['llama_server']}" if x.get("llama_server") else "", sid)
    if isinstance(searched, list):
        add(f"{DECISION_FOR}the mix", "1.00×", t.get("search.mix") or evidence.no_data("no mix line"), "", sid)
        if t.get("search.ladder"):
            add(f"{DECISION_FOR}the ladder vs the search", "-", t["search.ladder"], "", sid)
    term = decision.dominant_term(sw.pred, d, k)
    add(ITEMS[11], "-", term or evidence.no_data(f"no cost-model row for {d} n_max={k}"), "", sid)
    power = evidence.newest(c, "05_power", recipe)
    add(ITEMS[12], *_power(c, power), power.id)
    return rows


VARIANTS = (("GGML_AMX_INT8", "AMX"), ("GGML_AVX512_VNNI", "AVX-512 VNNI"), ("GGML_AVX512", "AVX-512"),
            ("GGML_AVX_VNNI", "AVX-VNNI"), ("GGML_AVX2", "AVX2"), ("GGML_AVX", "AVX"))


def _flags(flags: str | None) -> str:
    """The build's CMake flags in a few words: the full list is on the run (`labkit show`)."""
    if not flags:
        return "flags: -"
    words = str(flags).split()
    if len(flags) <= 60:
        return f"flags: {flags}"
    native = next((w.split("=", 1)[1] for w in words if "GGML_NATIVE=" in w), None)
    # the options the flags turn on (as engines.native.flags_on reads them; report never imports engines)
    on = {w.removeprefix("-D").split("=", 1)[0] for w in words if w.upper().endswith("=ON")}
    # the CPU variant: the widest x86 instruction set the flags turn on (the kernels it runs)
    isa = next((name for flag, name in VARIANTS if flag in on), None)
    kind = {"OFF": "portable build (GGML_NATIVE=OFF)", "ON": "native build"}.get(native or "", "build")
    if isa and native != "ON":  # GGML_NATIVE=OFF with a named variant: the variant says it
        kind = kind.replace("portable build (GGML_NATIVE=OFF)", f"portable {isa} build")
    return f"{kind}, {len(words)} CMake flags (labkit show)"


def _patches(text: str) -> str:
    """The patches the build carries, by name (their upstream references are on the run)."""
    names = [part.split(" (")[0].removesuffix(".patch") for part in str(text).split("; ")]
    return f"patched: {', '.join(names)}"


def candidate_cell(r: dict) -> str:
    """An accounting row's candidate in full: "same as baseline" read back as the baseline."""
    c = str(r["candidate"])
    return str(r["baseline"]) + c[len(SAME):] if c.startswith(SAME) else c


def _power(c, power) -> tuple[str, str, str]:
    from labkit.report import evidence

    table = evidence.table_or_none(c, power.run, "power-summary") if power.run is not None else None
    if table is None or table.empty:
        nd = evidence.no_data(power.why or f"{power.id} logged no power-summary table")
        return nd, nd, ""

    def cell(r) -> str:
        j, cpu = r.get("j_per_token"), r.get("cpu_s_per_token")
        return (f"k={int(r['k'])}: " + (f"{cpu * 1e3:.1f} ms CPU per token" if cpu is not None and pd.notna(cpu)
                                        else "CPU time not measured")
                + (f", {j:.3f} J per token" if j is not None and pd.notna(j) else ", energy not measured"))

    base, spec = table[table["k"] == 0], table[table["k"] > 0]
    return (cell(base.iloc[0]) if len(base) else evidence.no_data("no k=0 power row"),
            cell(spec.iloc[0]) if len(spec) else evidence.no_data("no speculative power row"),
            power.tags.get("power.summary", ""))


def _toolsuite(tools, cand) -> tuple[bool | None, dict]:
    from labkit.report import evidence

    if tools.run is None:
        nd = evidence.no_data(tools.why)
        return None, {"baseline": nd, "candidate": nd, "notes": ""}
    m, t = canonical_metrics(tools.metrics), tools.tags  # old and new metric keys
    d = cand["drafter"]
    verdicts = evidence.json_tag(t, "toolsuite.verdict") or {}
    within = evidence.json_tag(t, "toolsuite.within_tolerance") or {}
    ran_k = t.get("toolsuite.k")
    off = m.get("toolsuite/greedy.off")
    band = _sampled(m, "toolsuite/sampled.off")
    on = m.get(f"toolsuite/greedy.on.{d}")
    on_s = _sampled(m, f"toolsuite/sampled.on.{d}")
    p = m.get(f"toolsuite/mcnemar_p.{d}")
    notes = [verdicts.get(d, evidence.no_data(f"no verdict for {d}"))]
    if p is not None:
        notes.append(f"paired McNemar p = {p:.3g}")
    notes.append(f"ran at n_max={ran_k}" if ran_k else "the run did not record its k")
    if ran_k and int(ran_k) != cand["k"]:
        notes.append(f"not the candidate's n_max={cand['k']}: rerun 04_tool_suite_qc")
    return (bool(within[d]) if d in within else None), {
        "baseline": f"greedy {off:.1%}{band}" if off is not None else evidence.no_data("no off score"),
        "candidate": f"greedy {on:.1%}{on_s}" if on is not None else evidence.no_data(f"no on score for {d}"),
        "notes": "; ".join(notes)}


def _concurrency(c, conc, recipe) -> tuple[str, str, str, str | None]:
    """The production-concurrency row (baseline, candidate, notes) and, when 07's verdict
    says speculation loses there, that loss in words (else None)."""
    from labkit.report import evidence

    if conc.run is None:
        nd = evidence.no_data(f"{conc.why} (re-bench at the production concurrency is mandatory)")
        return nd, nd, "", None
    want = getattr(recipe, "production_concurrency", None)
    table = evidence.table_or_none(c, conc.run, "concurrency")
    verdict = evidence.table_or_none(c, conc.run, "concurrency-verdict")
    if table is None or table.empty:
        skipped = conc.run.data.tags.get("lab.skipped")
        nd = evidence.no_data(f"{conc.id} skipped the re-bench: {skipped}" if skipped
                              else f"{conc.id} logged no concurrency table")
        return nd, nd, "", None
    return (*concurrency_fields(table, verdict, want), concurrency_loss(verdict, conc.id))


def concurrency_loss(verdict: pd.DataFrame | None, source) -> str | None:
    """07's verdict in words when speculation does not beat plain decoding at the production
    concurrency ("labkit loses at c=4 (0.92×) [LAB:07-…]"), else None."""
    if verdict is None or verdict.empty or "speedup" not in verdict.columns:
        return None
    v = verdict.iloc[0]
    if pd.isna(v["speedup"]) or float(v["speedup"]) > 1.0:
        return None
    engine = f"{v['engine']} " if "engine" in verdict.columns and pd.notna(v["engine"]) else ""
    return f"{engine}loses at c={int(v['c'])} ({float(v['speedup']):.2f}×) [{source}]"


def concurrency_fields(table: pd.DataFrame, verdict: pd.DataFrame | None, want: int | None) -> tuple[str, str, str]:
    """Baseline / candidate / notes of the production-concurrency row, from 07's
    "concurrency" and "concurrency-verdict" tables, at the production concurrency ``want``
    (else the highest c measured). Each engine (labkit's loop, llama-server) is reported on
    its own: its plain aggregate, its best speculative arm and that arm's speedup against its
    own plain arm; numbers from two engines are never pooled or compared with each other."""
    from labkit.report import evidence

    at = want if want is not None and (table["c"] == want).any() else int(table["c"].max())
    g = table[(table["c"] == at) & (table["drafter"] != "aa")]  # the A/A control is not an arm
    base, cand = [], []
    for engine in dict.fromkeys(g["engine"]):
        e = g[g["engine"] == engine]
        plain, spec = e[e["k"] == 0], e[e["k"] > 0]
        base.append(f"{engine} {plain['agg_tok_s'].median():.1f}" if len(plain) else f"{engine} (no plain arm)")
        if len(spec):
            best = spec.loc[spec["agg_tok_s"].idxmax()]
            x = f", {float(best['speedup']):.2f}×" if pd.notna(best.get("speedup")) else ""
            cand.append(f"{engine} {best['agg_tok_s']:.1f} ({best['drafter']} k={int(best['k'])}{x})")
    base_s = (f"c={at}, tok/s aggregate: " + "; ".join(base)) if len(g[g["k"] == 0]) else evidence.no_data(
        f"no plain arm at c={at}")
    cand_s = (f"c={at}, tok/s aggregate: " + "; ".join(cand)) if cand else evidence.no_data(
        f"no speculative arm at c={at}")
    notes = "" if want is not None else "recipe sets no production_concurrency: the highest c measured"
    if verdict is not None and not verdict.empty:
        v = verdict[verdict["c"] == at]
        if len(v):
            said = str(v["verdict"].iloc[0])
            if "engine" in v.columns and pd.notna(v["engine"].iloc[0]):
                said = f"{v['engine'].iloc[0]}: {said}"
            notes = "; ".join(x for x in [notes, said] if x)
    return base_s, cand_s, notes


def field_sheet(rows: list[dict]) -> list[dict]:
    """The short field worksheet (7 items) drawn from the accounting rows."""
    by = {r["item"]: r for r in rows}
    out = []
    for item, parts in SHORT:
        vals, srcs = [], []
        for p in parts:
            r = by[p]
            if p.startswith("n_max"):  # how the candidate was chosen: the accounting table's notes
                vals.append(f"{r['baseline']} vs {r['candidate']}")
            elif p.startswith("warm decode"):
                vals.append(f"off {r['baseline']}; candidate {r['candidate']}")
            elif p.startswith("tool suite"):
                vals.append(r["baseline"] if r["baseline"] == r["candidate"] and not r["notes"]  # one "no data" said once
                            else f"off {r['baseline']}; on {r['candidate']}; {_suite_notes(r['notes'])}")
            elif p.startswith("decision"):
                vals.append(f"{r['candidate']}; {r['notes']}")
            elif p.startswith(("engine build", "model artifact")):
                vals.append(_compact(candidate_cell(r)))
            else:
                vals.append(candidate_cell(r))
            if r["source"] and r["source"] not in srcs:
                srcs.append(r["source"])
        out.append({"item": item, "value": " | ".join(vals), "source": ", ".join(srcs) or None})
        if item.startswith("7."):  # the search's per-workload decisions, each its own line
            for r in rows:
                if r["item"].startswith(DECISION_FOR):
                    label = r["item"][len(DECISION_FOR):]
                    value = str(r["candidate"])  # its own label said once ("edit: on, …" under "edit")
                    for lead in (f"{label}: ", f"{label} "):
                        value = value[len(lead):] if value.startswith(lead) else value
                    out.append({"item": f"   {label}", "value": value, "source": r["source"]})
    return out


def _sampled(m: dict, key: str) -> str:
    """"; sampled lo-hi" over the sampled runs, or the one value when 04 stopped after one run."""
    if f"{key}.lo" not in m:
        return ""
    lo, hi = m[f"{key}.lo"], m[f"{key}.hi"]
    return f"; sampled {lo:.1%}" if lo == hi else f"; sampled {lo:.1%}-{hi:.1%}"


def _suite_notes(notes: str) -> str:
    """The tool-suite verdict without its restated bands (the cell has just given both runs'
    scores): "within ±10: on 17.3%-25.0% (median 21.2%) vs off band 17.3%-21.2%; median …"
    reads "within ±10: median …"; the accounting table keeps it whole."""
    import re

    return re.sub(r"^(within ±[\d.]+|regression): on [^;]*? vs off (?:band )?[^;]*;\s*", r"\1: ", str(notes))


def _compact(text: str) -> str:
    """A field-sheet cell's identifiers cut to what tells them apart: commits and checksums to
    12 hex digits, a path to its file name (the accounting table keeps them whole)."""
    import re

    text = re.sub(r"\b([0-9a-f]{12})[0-9a-f]{28,52}\b", r"\1…", str(text))
    return re.sub(r"(?<![\w.])/(?:[^\s/]+/)+([^\s/]+)", r"\1", text)


def worksheet(c, recipe, *, owner: str | None = None) -> list[dict]:
    """The short field worksheet as {field, value, source} rows."""
    return [{"field": f["item"], "value": f["value"], "source": f["source"]}
            for f in field_sheet(accounting(c, recipe, owner=owner))]
