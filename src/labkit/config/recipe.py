"""Recipes: ``experiments/*.yaml`` loaded into one dataclass.

Unknown keys are rejected by name (a typo must not silently become a default), values
are checked, and nothing in a recipe is ever executed. The recipe hash (of the
normalised fields) ties every run back to exactly what was asked for.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from labkit import engines
from labkit.decoding import drafters
from labkit.decoding import policy as policies
from labkit.errors import LabkitError
from labkit.paths import experiments_dir

DEFAULT_RECIPE = "default"


@dataclass
class Recipe:
    name: str = DEFAULT_RECIPE
    description: str = ""
    engine: str = "llama.cpp"
    model: str = "gemma-3-270m-q4_k_m"  # zoo name or path to a .gguf (or an MLX directory)
    model_sha256: str | None = None
    draft_model: str | None = None
    draft_model_sha256: str | None = None
    drafters: list[str] = field(default_factory=lambda: ["ngram"])
    k: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4, 5, 6])
    workloads: list[str] = field(default_factory=lambda: ["edit", "prose_en", "prose_zh", "code", "tool_json"])
    prompts_per_workload: int = 8
    runs: int = 3
    max_tokens: int = 128
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    seed: int = 0
    threads: int | None = None
    n_ctx: int = 4096
    n_gpu_layers: int = 0
    gate: float = 0.60
    gate_window: int = 32
    gate_probe_every: int = 32
    ngram_min: int = 2
    ngram_max: int = 4
    kv_depth: int = 200
    verify_m: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 7, 8])
    verify_rounds: int = 48
    cost_models: list[str] = field(default_factory=lambda: ["synthetic-dense", "synthetic-moe"])
    toolsuite_runs: int = 3  # sampled runs at most (each over the whole suite, off and on)
    # sampled runs first; then one more at a time while the paired difference is undecided
    # against the tolerance (qc.control's looks); None: exactly toolsuite_runs
    toolsuite_min_runs: int | None = 1
    toolsuite_k: int = 3
    toolsuite_temperature: float = 0.7
    toolsuite_tasks: int | None = None  # None: the whole suite; N: the first N tasks (quick runs)
    power_workload: str = "edit"
    power_k: int | None = None  # None: the best k for power_workload from the newest k sweep
    sweep: str | None = None  # LAB ID of the 02_k_sweep run that 03/05/advise read; None: the newest matching
    interleave: str = "random"  # arm order in every comparison: random (per round, seeded) or abba
    notebooks: list[str] = field(default_factory=list)  # empty: all of notebooks/
    # the concurrency re-bench (07): the c values measured, and the c the verdict is given at
    production_concurrency: int = 4
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    source: str | None = None  # where it was loaded from (filled in by load)
    # field -> where a value that is not the file's came from ("env AS_SPEC_MIN_ACCEPT",
    # "-p gate", "--gate"); provenance, not part of the hash (the values are)
    origins: dict = field(default_factory=dict)
    # labkit reproduce's limits and guards: they decide whether a run may go on, not what it
    # measures, so they are left out of the recipe hash (RUN_CONTROL_FIELDS)
    cell_timeout_s: float | None = 3600.0  # a cell running longer fails its notebook; None: no limit
    run_timeout_s: float | None = None  # the whole reproduction's limit (`--timeout` overrides); None: none
    max_busy: float | None = None  # refuse to measure when other processes take more than this
    # fraction of all CPUs (0..1, e.g. 0.2); None: measure anyway (a busy run is still tagged)
    # The n_max protocol of notebook 02: "stepwise" steps k up from the smallest k per drafter
    # and stops at the first step that loses end-to-end (TTLT), collapses acceptance or leaves
    # the tool suite's band; "full" measures the whole k grid (for figures)
    protocol: str = "stepwise"
    protocol_min_speedup: float = 1.0  # the median e2e speedup vs plain a step must exceed
    protocol_min_acceptance: float = 0.4  # accepted / drafted below this is a collapse: stop
    protocol_toolsuite_tasks: int = 8  # tasks (spread over the suite) checked per step; 0: no suite check
    # The candidate: the k (and drafter) that the tool-suite control (04) runs at, written by
    # `labkit advise --write` from the protocol's winner; None: read the newest sweep's winner
    n_max: int | None = None
    n_max_drafter: str | None = None
    n_cpu_moe: int = 0  # llama.cpp --n-cpu-moe: keep the expert tensors of the first N layers on the host
    # tool-suite control: how many percentage points below the off runs' band an on run may
    # score and still pass (the chapter's "within the suite's ±10 noise")
    toolsuite_tolerance_pts: float = 10.0
    # How comparisons decide (analysis/decide.py): the effect is the geometric-mean paired ratio
    # with its CI; "wins" when the CI lies above 1 + margin, "loses" below 1 - margin, else
    # "no measurable difference" (then the simpler option: speculation off)
    decision_margin: float = 0.02  # the region of practical equivalence, ±2%
    decision_confidence: float = 0.95
    aa_control: bool = True  # a second plain arm in every comparison: plain vs plain must read no difference
    # the measuring budget: ``runs`` warm rounds at least, then one more round at a time while a
    # verdict is undecided, up to ``max_runs`` rounds (None: exactly ``runs``) and ``budget_s``
    # seconds of measuring per comparison (None: no time limit)
    max_runs: int | None = None
    budget_s: float | None = None
    owner: str | None = None  # who signs the worksheet's keep/reject decision (or `labkit worksheet --owner`)
    # A draft length policy (decoding.policy) measured as an arm beside the fixed k: `policy: priced`
    # or `auto` in k (`k: auto`, `k: [0, 1, 2, auto]`); None: fixed k only
    policy: str | None = None
    policy_k_max: int = 8  # the longest draft the policy may choose (verify(m) must be measured to k_max + 1)
    # without a verify(m) fit for this host and build: "measure" it first (policy_verify_rounds
    # rounds at kv_depth), or "error"
    policy_verify: str = "measure"
    policy_verify_rounds: int = 8
    # 01's cross-check against llama.cpp's own llama-bench on the same build: rounds of both arms
    # (alternating which goes first), and the tolerance within which they agree (0.10: ±10%)
    crosscheck_rounds: int = 5
    crosscheck_tolerance: float = 0.10
    # 01's per-op-class profile of a verify (measure.op_profile): rounds over every m; 0 skips it
    op_profile_rounds: int = 3
    # The search (protocol: search, analysis/search.py): the best-ranked fixed settings measured per
    # workload beside k auto; the share of each workload's prompts held out to check the decision
    # (seeded, split before anything is measured); the traffic the mix line is weighted by
    # (workload -> share of generated tokens; None: equal shares)
    search_candidates: int = 1
    search_auto: bool = True  # the priced policy (recipe policy, else priced) as a candidate in every workload
    check_share: float = 0.4
    # more choosing prompts per workload, held in reserve (the next ones in each workload's file, fixed
    # before anything is measured): the rounds after the first measure a workload's still-undecided
    # candidates on fresh reserve prompts, not again on the same ones (more prompts narrow the spread
    # over prompts, which repeating a prompt does not); 0: those rounds repeat the choosing prompts.
    # With max_runs == runs there is no later round and the reserve is neither read nor needed.
    reserve_prompts: int = 0
    traffic_mix: dict | None = None
    # per workload, the setting to deploy ("ngram k=5", "ngram k=auto", "off"), written by
    # `labkit advise --write` from the search's decisions beside the LAB ID of the evidence
    workload_settings: dict | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source")
        d.pop("origins")
        return d

    def origin_of(self, name: str) -> str:
        """Where the effective value of field ``name`` came from."""
        return self.origins.get(name) or (f"recipe file {self.source}" if self.source else "default")

    RUN_CONTROL_FIELDS = ("cell_timeout_s", "run_timeout_s", "max_busy")
    POLICY_FIELDS = ("policy", "policy_k_max", "policy_verify", "policy_verify_rounds")
    # fields added later leave a recipe's hash as it was before them while at their defaults
    # (01's cross-check; the tool suite's sequential runs)
    LATER_DEFAULTS = {"crosscheck_rounds": 5, "crosscheck_tolerance": 0.10, "toolsuite_min_runs": 1,
                      "search_candidates": 1, "search_auto": True, "check_share": 0.4, "traffic_mix": None,
                      "reserve_prompts": 0, "workload_settings": None, "op_profile_rounds": 3}

    @property
    def hash(self) -> str:
        """sha256 of the normalised recipe fields (not of the YAML text; not of the
        RUN_CONTROL_FIELDS), 12 hex digits."""
        d = {k: v for k, v in self.to_dict().items() if k not in self.RUN_CONTROL_FIELDS
             and not (k in self.POLICY_FIELDS and self.policy is None)  # recipes without a policy keep their hash
             and not (k in self.LATER_DEFAULTS and v == self.LATER_DEFAULTS[k])}
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    SWEEP_FIELDS = (
        "engine", "model", "model_sha256", "draft_model", "draft_model_sha256", "drafters", "k", "workloads",
        "prompts_per_workload", "runs", "max_tokens", "temperatures", "seed", "threads", "n_ctx", "n_gpu_layers",
        "gate", "gate_window", "gate_probe_every", "ngram_min", "ngram_max", "interleave",
        "protocol", "protocol_min_speedup", "protocol_min_acceptance", "n_cpu_moe",
        "decision_margin", "decision_confidence", "aa_control", "max_runs", "budget_s",
        "search_candidates", "search_auto", "check_share", "traffic_mix", "reserve_prompts",
    )

    @property
    def sweep_hash(self) -> str:
        """Hash of the fields that determine a k sweep: notebooks that read a sweep (03, 05,
        advise) find it by this, whatever other fields (tool suite, power) they override."""
        d = self.to_dict()
        blob = json.dumps({k: d[k] for k in self.SWEEP_FIELDS}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def validate(self) -> Recipe:
        where = f"recipe {self.name!r}" + (f" ({self.source})" if self.source else "")

        def bad(msg: str, fix: str):
            raise LabkitError(f"{where}: {msg}", fix)

        if any(x < 0 for x in self.k):
            bad(f"k contains a negative value {min(self.k)}", "k values are draft lengths: use 0 (plain) or more")
        if not self.k:
            bad("k is empty", "list at least one draft length, e.g. k: [0, 3]")
        for d in self.drafters:
            if d not in drafters.DRAFTERS:
                bad(f"unknown drafter {d!r}", f"use one of {drafters.names()}")
        if "model" in self.drafters and not self.draft_model:
            bad("drafter 'model' needs draft_model", "set draft_model to a zoo name or .gguf path, or drop 'model'")
        if self.runs < 1:
            bad(f"runs = {self.runs}", "use runs >= 1 (3 or more for ranges)")
        if not 0 < self.decision_margin < 0.5:
            bad(f"decision_margin = {self.decision_margin} is outside (0, 0.5)",
                "use a fraction such as decision_margin: 0.02 (the band 0.98–1.02 counts as no difference)")
        if not 0.5 < self.decision_confidence < 0.999:
            bad(f"decision_confidence = {self.decision_confidence} is outside (0.5, 0.999)",
                "use a confidence level such as decision_confidence: 0.95")
        if self.max_runs is not None and self.max_runs < self.runs:
            bad(f"max_runs = {self.max_runs} is below runs = {self.runs}: a budget too small for the minimum rounds",
                f"set max_runs >= {self.runs} (e.g. {max(6, self.runs)}), or null to measure exactly runs rounds")
        if self.budget_s is not None and self.budget_s <= 0:
            bad(f"budget_s = {self.budget_s} leaves no time for even one round",
                "use seconds of measuring per comparison > 0 (e.g. 600), or null for no time limit")
        if self.protocol in ("stepwise", "search") and not self.aa_control:
            bad(f"aa_control is off while protocol: {self.protocol} is on: the protocol's verdicts would have no A/A "
                "control to say whether this box's noise allows them",
                "set aa_control: true (the default), or use protocol: full for figures without verdicts")
        if self.max_tokens < 1:
            bad(f"max_tokens = {self.max_tokens}", "use max_tokens >= 1")
        if not 0.0 <= self.gate <= 1.0:
            bad(f"gate = {self.gate} is outside [0, 1]", "use e.g. gate: 0.6 (0 disables it)")
        if any(t < 0 for t in self.temperatures):
            bad("a temperature is negative", "use 0 for greedy or a positive temperature")
        if not 1 <= self.ngram_min <= self.ngram_max:
            bad(f"ngram_min={self.ngram_min}, ngram_max={self.ngram_max}", "use 1 <= ngram_min <= ngram_max")
        if self.engine not in engines.ENGINES:
            bad(f"unknown engine {self.engine!r}", f"use one of {', '.join(engines.ENGINES)}")
        if self.interleave not in ("random", "abba"):
            bad(f"interleave = {self.interleave!r}", "use interleave: random (the default) or abba")
        if any(m < 1 for m in self.verify_m):
            bad("verify_m contains a value < 1", "verify row counts start at 1")
        if self.protocol not in ("search", "stepwise", "full"):
            bad(f"protocol = {self.protocol!r}", "use protocol: search (rank by the replay, decide per workload), "
                "stepwise (the chapter's n_max ladder alone) or full (every k)")
        if self.search_candidates < 1:
            bad(f"search_candidates = {self.search_candidates}: the search must measure at least one candidate",
                "set search_candidates to 1 or more (1: the predicted best fixed k per workload, beside k auto)")
        if not 0 < self.check_share < 1:
            bad(f"check_share = {self.check_share} is outside (0, 1)",
                "hold out a fraction of each workload's prompts to check the decision, e.g. check_share: 0.4")
        if self.reserve_prompts < 0:
            bad(f"reserve_prompts = {self.reserve_prompts} is negative",
                "set reserve_prompts to 0 (extra rounds repeat the choosing prompts) or more (fresh prompts for them)")
        mix_weights(self.traffic_mix, self.workloads, where=where)
        for w, v in (self.workload_settings or {}).items():
            if w not in self.workloads or not re.fullmatch(r"off|\S+ k=(auto|\d+)", str(v)):
                bad(f"workload_settings has {w}: {v!r}", "use a workload of the recipe and a setting such as "
                    "'ngram k=5', 'ngram k=auto' or 'off' (labkit advise --write writes them)")
        if not 0.0 <= self.protocol_min_acceptance <= 1.0:
            bad(f"protocol_min_acceptance = {self.protocol_min_acceptance} is outside [0, 1]",
                "use e.g. protocol_min_acceptance: 0.4")
        if self.protocol_min_speedup <= 0:
            bad(f"protocol_min_speedup = {self.protocol_min_speedup}", "use e.g. 1.0 (a step must beat plain)")
        if self.protocol_toolsuite_tasks < 0:
            bad(f"protocol_toolsuite_tasks = {self.protocol_toolsuite_tasks}", "use 0 (no suite check) or more")
        if self.n_max is not None and self.n_max < 0:
            bad(f"n_max = {self.n_max}", "n_max is a draft length: 0 (disable) or more, or null")
        if self.n_max_drafter is not None and self.n_max_drafter not in self.drafters:
            bad(f"n_max_drafter {self.n_max_drafter!r} is not one of the recipe's drafters {self.drafters}",
                "set n_max_drafter to one of drafters, or add it to drafters")
        if self.n_cpu_moe < 0:
            bad(f"n_cpu_moe = {self.n_cpu_moe}", "use 0 (experts follow n_gpu_layers) or N >= 1")
        if self.n_cpu_moe and self.engine != "llama.cpp":
            bad(f"n_cpu_moe is a llama.cpp setting (engine is {self.engine})", "drop n_cpu_moe for this engine")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            bad(f"concurrency = {self.concurrency}", "list the concurrent streams to measure, e.g. [1, 2, 4, 8]")
        if self.production_concurrency < 1:
            bad(f"production_concurrency = {self.production_concurrency}", "use the c you serve, >= 1 (e.g. 4)")
        # above toolsuite_runs it is toolsuite_runs (a quick run's `-p toolsuite_runs=1` keeps the default)
        if self.toolsuite_min_runs is not None and self.toolsuite_min_runs < 1:
            bad(f"toolsuite_min_runs = {self.toolsuite_min_runs}: the first look needs a sampled run",
                "use 1 or more (1: the default), or null for exactly toolsuite_runs sampled runs")
        if self.toolsuite_tolerance_pts < 0:
            bad(f"toolsuite_tolerance_pts = {self.toolsuite_tolerance_pts} is negative",
                "use points below the off band an on run may score, e.g. 10")
        for key in ("model_sha256", "draft_model_sha256"):
            v = getattr(self, key)
            if v is not None and (len(v) != 64 or any(c not in "0123456789abcdef" for c in v.lower())):
                bad(f"{key} is not a sha256 hex digest", "use the 64-hex-digit value `labkit models` prints")
        for key in ("cell_timeout_s", "run_timeout_s"):
            if getattr(self, key) is not None and getattr(self, key) <= 0:
                bad(f"{key} = {getattr(self, key)}", "use a number of seconds > 0, or null for no limit")
        if self.policy is not None:
            if self.policy not in policies.POLICIES:
                bad(f"unknown policy {self.policy!r}", f"use one of {policies.names()} (or k: auto), or null")
        if self.op_profile_rounds < 0:
            bad(f"op_profile_rounds = {self.op_profile_rounds}: a count of rounds",
                "use op_profile_rounds >= 1 (3 is the default), or 0 to skip 01's per-op profile")
        if self.crosscheck_rounds < 2:
            bad(f"crosscheck_rounds = {self.crosscheck_rounds}: one round gives the ratio no interval",
                "use crosscheck_rounds >= 2 (5 is the default), or 0 verify rounds to skip 01")
        if not 0 < self.crosscheck_tolerance < 0.5:
            bad(f"crosscheck_tolerance = {self.crosscheck_tolerance} is outside (0, 0.5)",
                "use a fraction such as crosscheck_tolerance: 0.10 (labkit within ±10% of llama-bench)")
        if self.policy_k_max < 1:
            bad(f"policy_k_max = {self.policy_k_max}",
                "use policy_k_max >= 1 (e.g. 8): the longest draft the policy may choose")
        if self.policy_verify not in ("measure", "error"):
            bad(f"policy_verify = {self.policy_verify!r}",
                "use measure (measure verify(m) first when there is no fit) or error")
        if self.policy_verify_rounds < 1:
            bad(f"policy_verify_rounds = {self.policy_verify_rounds}", "use >= 1 (e.g. 8)")
        if self.max_busy is not None and not 0.0 < self.max_busy <= 1.0:
            bad(f"max_busy = {self.max_busy} is outside (0, 1]",
                "use the fraction of all CPUs other processes may take, e.g. max_busy: 0.2, or null")
        return self


def mix_weights(mix: dict | None, workloads: list[str], *, where: str = "the recipe") -> dict[str, float]:
    """``traffic_mix`` as workload -> share of generated tokens (None: equal shares), checked:
    every key a workload of the recipe, every share 0 or more, the shares summing to 1."""
    if not mix:
        return {w: 1 / len(workloads) for w in workloads} if workloads else {}
    if not isinstance(mix, dict):
        raise LabkitError(f"{where}: traffic_mix = {mix!r} is not a mapping",
                          "write it as workload: share, e.g. traffic_mix: {edit: 0.5, code: 0.5}")
    unknown = sorted(set(mix) - set(workloads))
    if unknown:
        raise LabkitError(f"{where}: traffic_mix names {unknown[0]!r}, which is not one of the workloads {workloads}",
                          f"use workloads from {workloads} in traffic_mix, or add {unknown[0]!r} to workloads")
    for w, v in mix.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise LabkitError(f"{where}: traffic_mix gives {w!r} the share {v!r}: shares are 0 or more",
                              f"set traffic_mix.{w} to a share between 0 and 1")
    total = float(sum(mix.values()))
    if abs(total - 1) > 1e-6:
        raise LabkitError(f"{where}: traffic_mix sums to {total:g}, not 1",
                          "give each workload its share of the generated tokens so that the shares add up to 1")
    return {w: float(mix.get(w, 0.0)) for w in workloads}


_FIELDS = {f.name: f for f in dataclasses.fields(Recipe)}


def _coerce(name: str, value, where: str, fix_where: str = "in the recipe"):
    """Check a YAML value against the field's declared type (no exec, no magic)."""
    f = _FIELDS[name]
    t = str(f.type)
    ok = True
    if t.startswith("list["):
        inner = t[5:-1]
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            value = [value]  # `k: 3` means `k: [3]`
        ok = isinstance(value, list) and all(_is(inner, v) for v in value)
        if ok and inner == "float":
            value = [float(v) for v in value]
    else:
        ok = _is(t, value)
        if ok and t == "float" and value is not None:
            value = float(value)
    if not ok:
        raise LabkitError(
            f"{where}: {name} = {value!r} has the wrong type (expected {t})",
            f"fix the value of {name!r} {fix_where}",
        )
    return value


def _is(t: str, v) -> bool:
    if v is None:
        return "None" in t
    base = t.replace(" | None", "")
    if base == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if base == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if base == "str":
        return isinstance(v, str)
    if base == "bool":
        return isinstance(v, bool)
    return True


def from_dict(data: dict, *, source: str | None = None, origins: dict | None = None) -> Recipe:
    """A validated recipe; ``origins`` (field -> where its value came from) decides whom a
    bad value is blamed on: the recipe file, a ``-p`` flag or an environment variable."""
    origins = origins or {}
    where = f"recipe {source or data.get('name', '?')}"
    if not isinstance(data, dict):
        raise LabkitError(f"{where}: the top level must be a mapping of keys", "see experiments/default.yaml")
    unknown = [k for k in data if k not in _FIELDS or k in ("source", "origins")]
    if unknown:
        k = unknown[0]
        near = difflib.get_close_matches(k, [n for n in _FIELDS if n not in ("source", "origins")], n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"known keys: {', '.join(sorted(_FIELDS))}"
        raise LabkitError(f"{where}: unknown key {k!r}", f"remove it or correct it ({hint})")
    data = _auto_k(data, origins)
    kw = {k: _coerce(k, v, where if k not in origins else origins[k],
                     f"({origins[k]})" if k in origins else f"in {source or 'the recipe'}") for k, v in data.items()}
    try:
        return Recipe(**kw, source=source, origins=dict(origins)).validate()
    except LabkitError as e:
        blamed = [o for k, o in origins.items() if f" {k}" in e.problem or f"{k} " in e.problem]
        if blamed:
            raise LabkitError(f"{e.problem} (set by {blamed[0]})", f"{e.fix}; change {blamed[0]}") from None
        raise


def _auto_k(data: dict, origins: dict) -> dict:
    """``k: auto`` (or ``auto`` in a k list) is the priced policy as an arm: the fixed k
    listed stay (plain, k = 0, always), and ``policy`` becomes ``priced`` unless set."""
    k = data.get("k")
    items = k if isinstance(k, list) else [k]
    if not any(isinstance(x, str) and x.strip().lower() == "auto" for x in items):
        return data
    data = dict(data)
    fixed = [x for x in items if not (isinstance(x, str) and x.strip().lower() == "auto")]
    data["k"] = sorted({0, *fixed}) if all(isinstance(x, int) for x in fixed) else fixed
    data["policy"] = data.get("policy") or "priced"
    if "k" in origins:
        origins.setdefault("policy", origins["k"])
    return data


def load(name_or_path: str | Path | None = None) -> Recipe:
    """Load ``experiments/<name>.yaml`` or a YAML path; None loads the default recipe."""
    name_or_path = name_or_path or DEFAULT_RECIPE
    p = Path(name_or_path)
    if not p.suffix:
        p = experiments_dir() / f"{name_or_path}.yaml"
    if not p.is_file():
        avail = sorted(x.stem for x in experiments_dir().glob("*.yaml"))
        raise LabkitError(f"recipe not found: {p}", f"use one of {avail} or a path to a YAML file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise LabkitError(f"recipe {p} is not valid YAML: {e}", "fix the YAML syntax") from e
    return from_dict(data or {}, source=str(p))

RECIPE_FIELDS = set(Recipe.__dataclass_fields__) - {"source", "origins"}
# environment variables that change a measurement, and the recipe field each sets; they
# are resolved here, once, at the boundary, and recorded in the run as the field's origin
ENV_FIELDS = {"AS_SPEC_MIN_ACCEPT": "gate"}


def resolve(recipe: Recipe, overrides: dict | None = None, *, origin: str = "override", env=None) -> Recipe:
    """The effective recipe: file < environment (``ENV_FIELDS``) < ``overrides`` (None
    values skipped). Every value not from the file keeps its origin in ``recipe.origins``."""
    env = os.environ if env is None else env
    data, origins = recipe.to_dict(), dict(recipe.origins)
    for var, name in ENV_FIELDS.items():
        raw = env.get(var)
        if raw:
            try:
                data[name] = float(raw)
            except ValueError as e:
                raise LabkitError(f"{var}={raw!r} is not a number", f"set {var} to e.g. 0.6, or unset it") from e
            origins[name] = f"env {var}={raw}"
    for k, v in (overrides or {}).items():
        if k in RECIPE_FIELDS and v is not None:
            data[k] = v
            origins[k] = origin.format(name=k)
    return from_dict(data, source=recipe.source, origins=origins)


def effective_recipe(params: dict) -> Recipe:
    """The named recipe with the environment and every notebook parameter that names a
    recipe field (and is not None) applied; a bad value is blamed on its ``-p`` flag."""
    return resolve(load(params.get("recipe")), params, origin="-p {name}")
