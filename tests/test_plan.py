"""The planner on constructed profiles with known answers, GGUF headers of real layouts
(header-only files written with the ``gguf`` package, and the embedded model), bad input."""

from __future__ import annotations

import json

import pytest

from labkit.analysis import plan
from labkit.analysis.plan import Placement
from labkit.artifacts import gguf_profile as gp
from labkit.errors import LabkitError

CPU = {"host": {"bandwidth_gbs": 10.0, "matvec_ns_per_param": 0.1, "row_ns_per_param": 0.02,
                "odd_ns_per_param": 0.01}, "device": None, "device_note": "not measured: no accelerator",
       "overhead_ms": 0.5}
GPU_BOX = {"host": {"bandwidth_gbs": 60.0, "row_ns_per_param": 0.0}, "overhead_ms": 1.0,
           "device": {"bandwidth_gbs": 900.0, "row_ns_per_param": 0.00005}}


def _write(tmp_path, name, **kw):
    tensors, md = gp.layout(**kw)
    return gp.read_profile(gp.write_header_only(tmp_path / f"{name}.gguf", arch=kw["arch"], tensors=tensors,
                                                metadata=md))


@pytest.fixture(scope="module")
def qwen3moe(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("h"), "qwen3moe", arch="qwen3moe", n_layer=48, n_embd=2048, n_head=32,
                  n_head_kv=4, n_vocab=151936, n_expert=128, n_expert_used=8, n_ff_exp=768)


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("h"), "deepseek", arch="deepseek2", n_layer=61, n_embd=7168, n_head=128,
                  n_head_kv=128, n_vocab=129280, n_ff=18432, n_expert=256, n_expert_used=8, n_ff_exp=2048,
                  n_expert_shared=1, n_dense_lead=3, n_nextn=1, mla_rank=1536)


def _pair(tmp_path, E):
    """A dense model and an MoE whose E experts of n_ff/E each hold the dense FFN's weights, u = E."""
    common = {"n_layer": 4, "n_embd": 512, "n_head": 8, "n_head_kv": 2, "n_vocab": 4096}
    dense = _write(tmp_path, "dense", arch="llama", n_ff=2048, **common)
    moe = _write(tmp_path, f"moe{E}", arch="llama", n_expert=E, n_expert_used=E, n_ff_exp=2048 // E, **common)
    return dense, moe


# -- headers -----------------------------------------------------------------------------------
def test_qwen3_moe_header_splits_bytes_by_role(qwen3moe):
    p = qwen3moe
    assert (p.architecture, p.n_layer, p.n_expert, p.n_expert_used, p.n_nextn) == ("qwen3moe", 48, 128, 8, 0)
    s = p.summary()
    per_expert = 3 * 2048 * 768 * 144 // 256  # gate, up, down of one expert in Q4_K (144 bytes per 256 values)
    assert s["expert_bytes_per_expert"] == 48 * per_expert
    assert s["ffn_dense_bytes"] == 0 and s["ffn_shared_bytes"] == 0 and s["attention_bytes"] > 0
    assert s["output_bytes"] == 151936 * 2048 * 210 // 256 and not p.output_tied  # Q6_K output
    assert not p.unclassified and p.known_architecture and p.moe


def test_deepseek_header_has_shared_experts_dense_lead_and_nextn(deepseek):
    p = deepseek
    assert (p.n_layer, p.n_nextn) == (61, 1) and p.layers[-1].nextn
    assert [lay.bytes["ffn_dense"] > 0 for lay in p.trunk[:4]] == [True, True, True, False]
    assert all(lay.bytes["ffn_shared"] > 0 for lay in p.trunk[3:])
    assert p.nextn_bytes > 0 and not p.unclassified
    assert p.summary()["total_bytes"] > 300e9  # a ~380 GB model, profiled from a 64 kB header


def test_embedded_model_profile_ties_the_output_to_the_embedding(embedded_path):
    p = gp.read_profile(embedded_path)
    assert p.architecture == "gemma3" and p.output_tied and p.output_bytes == p.embeddings_bytes
    assert not p.moe and not p.unclassified and "Q4_K" in p.quant_types
    assert p.total_bytes < 260e6


@pytest.fixture(scope="module")
def embedded_path():
    from labkit.artifacts import zoo

    return str(zoo.get("gemma-3-270m-q4_k_m").path)


# -- known answers -----------------------------------------------------------------------------
def test_doubling_host_bandwidth_halves_the_spilled_term(qwen3moe):
    fast = {**GPU_BOX, "host": {**GPU_BOX["host"], "bandwidth_gbs": 120.0}}
    p = Placement(gpu_layers=49, n_cpu_moe=24)
    for rows in (1, 4, 16):
        a, b = plan.verify_terms(qwen3moe, GPU_BOX, p, rows), plan.verify_terms(qwen3moe, fast, p, rows)
        assert a["host_experts"] > 0
        assert b["host_experts"] == pytest.approx(a["host_experts"] / 2, rel=1e-12)
        assert b["device_read"] == a["device_read"] and b["device_experts"] == a["device_experts"]


def test_an_moe_with_u_equal_e_behaves_like_the_dense_model(tmp_path):
    dense, moe = _pair(tmp_path, 4)
    no_compute = {"host": {"bandwidth_gbs": 10.0}, "overhead_ms": 0.0, "device": None}
    for rows in (1, 2, 5, 8):
        d, m = (plan.verify_terms(x, no_compute, Placement(), rows) for x in (dense, moe))
        # the same FFN bytes read once, whatever the row count; the MoE adds only its router
        router = sum(lay.bytes["router"] for lay in moe.trunk) / 1e7
        assert m["ms"] - router == pytest.approx(d["ms"], rel=1e-12)
    growth = [plan.verify_ms(moe, CPU, Placement(), r) - plan.verify_ms(moe, CPU, Placement(), 1) for r in (2, 4, 8)]
    dense_growth = [plan.verify_ms(dense, CPU, Placement(), r) - plan.verify_ms(dense, CPU, Placement(), 1)
                    for r in (2, 4, 8)]
    assert growth == pytest.approx(dense_growth, rel=0.01)  # compute: the router's parameters only


def test_c_times_m_rows_saturate_at_e_experts(qwen3moe):
    E, u = 128, 8
    seq = [plan.distinct_experts(E, u, r) for r in (1, 2, 4, 8, 32, 128, 1024)]
    assert seq[0] == pytest.approx(u) and all(a < b for a, b in zip(seq, seq[1:]))
    assert seq[-1] == pytest.approx(E, rel=1e-9) and max(seq) <= E
    p = Placement(gpu_layers=49, n_cpu_moe=48)
    all_experts = sum(lay.bytes["experts"] for lay in qwen3moe.trunk) / (60.0 * 1e6)
    assert plan.verify_terms(qwen3moe, GPU_BOX, p, 4 * 256)["host_experts"] == pytest.approx(all_experts, rel=1e-6)
    # c streams x m rows is one batch of c*m rows: c=2, m=4 reads what c=1, m=8 reads
    a = plan.cell(qwen3moe, GPU_BOX, p, 3, [0.8, 0.6, 0.5], c=2)
    assert a["V_ms"] == pytest.approx(plan.verify_ms(qwen3moe, GPU_BOX, p, 8))


def test_spill_makes_speculation_lose_on_moe_and_the_flip_is_found(qwen3moe):
    res = plan.plan(qwen3moe, GPU_BOX, placements=[Placement(49, 0), Placement(49, 48)], n_max=[0, 1, 2, 3],
                    acceptance=[0.85, 0.7, 0.59])
    e = {(r["n_cpu_moe"], r["n_max"]): r for r in res["E"]}
    assert e[(0, 2)]["speedup"] > e[(48, 2)]["speedup"]
    assert e[(48, 3)]["dominant"] == "spilled expert reads (host)"
    fl = {f["n_max"]: f for f in res["flips"]}
    assert len(fl[1]["axis"]) == 49 and fl[1]["text"].startswith("n_max=1")
    sp = [x["speedup"] for x in fl[2]["axis"]]
    assert sp == sorted(sp, reverse=True)  # more spill, less speedup


def test_b_section_per_c(tmp_path):
    """Memory-bound (no per-row compute): every step reads the same bytes, so the speedup is the
    tokens per step at any c; with per-row compute, more streams leave speculation less to win."""
    dense, _ = _pair(tmp_path, 4)
    mem_only = {"host": {"bandwidth_gbs": 10.0}, "overhead_ms": 0.0, "device": None}
    res = plan.plan(dense, mem_only, placements=[Placement()], n_max=[0, 2], acceptance=[0.8, 0.6], cs=[1, 2, 4])
    assert [r["speedup"] for r in res["B"] if r["n_max"] == 2] == pytest.approx([2.4, 2.4, 2.4])
    res = plan.plan(dense, CPU, placements=[Placement()], n_max=[0, 2], acceptance=[0.8, 0.6], cs=[1, 2, 4])
    b = {(r["c"], r["n_max"]): r for r in res["B"]}
    assert b[(4, 0)]["tok_s"] > b[(1, 0)]["tok_s"]  # batching streams amortises the weight reads
    assert b[(4, 2)]["speedup"] < b[(2, 2)]["speedup"] < b[(1, 2)]["speedup"]


def test_unknown_architecture_lists_what_it_could_not_classify_and_still_plans(tmp_path):
    tensors, md = gp.layout(arch="llama", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_vocab=1024, n_ff=512)
    tensors += [("blk.0.weird_mixer.weight", (256, 256), "Q8_0"), ("mystery_head.weight", (256, 64), "F32")]
    md = {k.replace("llama.", "mystery."): v for k, v in md.items()}
    p = gp.read_profile(gp.write_header_only(tmp_path / "m.gguf", arch="mystery", tensors=tensors, metadata=md))
    assert not p.known_architecture and set(p.unclassified) == {"blk.0.weird_mixer.weight", "mystery_head.weight"}
    assert any("weird_mixer" in w for w in p.warnings) and any("'mystery'" in w for w in p.warnings)
    res = plan.plan(p, CPU, placements=[Placement()], n_max=[0, 1], acceptance=[0.7])
    assert res["E"][1]["tok_s"] > 0


# -- bad input ---------------------------------------------------------------------------------
def test_truncated_or_foreign_headers_are_refused(tmp_path, qwen3moe):
    whole = open(qwen3moe.path, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(LabkitError, match="truncated"):
        gp.read_profile(cut)
    other = tmp_path / "x.gguf"
    other.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(LabkitError, match="not a GGUF"):
        gp.read_profile(other)
    with pytest.raises(LabkitError, match="not found"):
        gp.read_profile(tmp_path / "none.gguf")


def test_bad_placements(qwen3moe, tmp_path):
    dense, _ = _pair(tmp_path, 4)
    with pytest.raises(LabkitError, match="dense model") as e:
        plan.check_placement(dense, GPU_BOX, Placement(5, 2))
    assert "--n-cpu-moe" in e.value.fix
    with pytest.raises(LabkitError, match="more than the model has") as e:
        plan.check_placement(qwen3moe, GPU_BOX, Placement(60, 0))
    assert "0..49" in e.value.fix
    with pytest.raises(LabkitError, match="needs an accelerator"):
        plan.check_placement(qwen3moe, CPU, Placement(10, 0))


@pytest.mark.parametrize("acc, what", [([0.9, 1.2], "outside"), ([85, 70], "outside"), ([0.6, 0.7], "above"),
                                       ([], "empty")])
def test_bad_acceptance(acc, what):
    with pytest.raises(LabkitError, match=what):
        plan.check_acceptance(acc)


def test_cli_plan_prints_a_table_or_json(qwen3moe, tmp_path, capsys):
    from labkit import cli

    prof = tmp_path / "box.json"
    prof.write_text(json.dumps(GPU_BOX))
    argv = ["plan", "--model", qwen3moe.path, "--profile", str(prof), "--gpu-layers", "49",
            "--n-cpu-moe", "0,24,48", "--n-max", "0..3", "--c", "1,2", "--acceptance", "0.85,0.7,0.59"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any("n-cpu-moe 24" in line for line in out) and not any(line.startswith("{") for line in out)
    assert cli.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["E"]) == 12 and len(doc["B"]) == 8 and doc["flips"]
    rc = cli.main(["plan", "--model", qwen3moe.path, "--profile", str(prof), "--acceptance", "0.5,0.9"])
    assert rc == 2 and "non-increasing" in capsys.readouterr().err


def test_published_comparison_reports_every_cell_and_knows_its_own_predictions():
    """The seeds' §E: every published cell beside its prediction, with the shape checks. Fed
    its own predictions at a known host per-row rate as if published, the leave-one-row-out fit
    recovers that rate in every fold and the predictions exactly (errors 0, shape all matching)."""
    import copy

    from labkit.analysis import plan_published
    from labkit.artifacts import published

    data = published.load()
    models = published.model_profiles(data)
    res = plan_published.compare(data, models)
    assert len(res["cells"]) == sum(len(r["cells"]) for r in data["published"]["chapter3_E"]) == 7
    assert res["row_order_match"]  # speedup grows as spill shrinks, dense zero spill first
    assert res["row_order_predicted"] == ["dense, zero spill", "MoE, 10 layers spilled", "MoE, 14 layers spilled",
                                          "MoE, 24 layers spilled"]
    assert all(c["published_tok_s"] > 0 and c["predicted_tok_s"] > 0 for c in res["cells"])
    spilled = [c for c in res["cells"] if c["spilled_layers"] > 0]
    assert all(c["host_row_source"] == "fitted on the other spilled rows" for c in spilled)
    assert len({round(c["host_row_ns_per_param"], 9) for c in spilled}) == 3  # one fit per held-out row
    assert set(res["without_host_row_term"]) >= {"winners_match", "signs_match", "median_abs_speedup_error"}
    known = 0.05
    truth = plan_published.compare(data, models, host_row_ns_per_param=known)
    mine = copy.deepcopy(data)
    it = iter(truth["cells"])
    for row in mine["published"]["chapter3_E"]:  # its predicted speedups, on the published baselines
        for c in row["cells"]:
            c["tok_s"] = next(it)["predicted_speedup"] * row["baseline_tok_s"]
    again = plan_published.compare(mine, models)
    assert again["winners_match"] and again["signs_match"] and again["row_order_match"]
    assert all(c["host_row_ns_per_param"] == pytest.approx(known, rel=1e-3)
               for c in again["cells"] if c["spilled_layers"] > 0)
    assert max(abs(c["speedup_error"]) for c in again["cells"]) < 1e-4
    bare = plan_published.compare(data, models, host_row_ns_per_param=0.0)  # without the term: the miss, named
    missed = plan_published.missed_term(bare["cells"])
    assert all("ms per token" in line for line in missed[:-1])
    assert missed[-1].startswith("over the spilled rows: an extra verify row costs")
    real = plan_published.extra_row_shape(bare["cells"])  # the extra row's cost against spill (arithmetic: below)
    assert real["cells"] == 6 and real["line"].startswith("an extra verify row costs")


def test_a_dearer_host_row_makes_spilled_speculation_dearer():
    """The host per-row term prices only spilled rows: doubling it lowers every spilled cell's
    predicted speedup and leaves the zero-spill dense row alone."""
    from labkit.analysis import plan_published
    from labkit.artifacts import published

    data = published.load()
    models = published.model_profiles(data)
    a = plan_published.compare(data, models, host_row_ns_per_param=0.04)["cells"]
    b = plan_published.compare(data, models, host_row_ns_per_param=0.08)["cells"]
    for x, y in zip(a, b):
        if x["spilled_layers"]:
            assert y["predicted_speedup"] < x["predicted_speedup"]
        else:
            assert y["predicted_speedup"] == pytest.approx(x["predicted_speedup"])


def test_extra_row_shape_recovers_a_known_line():
    """Constructed cells (labelled numbers): plain step 40 + 0.5·spilled ms, an extra row 5 + 2·spilled ms."""
    from labkit.analysis import plan_published

    cells = []
    for spilled, k in ((10, 1), (10, 2), (20, 1), (30, 3)):
        H = 40 + 0.5 * spilled
        V = H + k * (5 + 2 * spilled)
        tok = 1 + 0.8 * k
        cells.append({"spilled_layers": spilled, "n_max": k, "tokens_per_step": tok, "published_tok_s": 1e3 * tok / V,
                      "published_baseline_tok_s": 1e3 / H, "predicted_tok_s": 1e3 * tok / (H + k * 10),
                      "predicted_baseline_tok_s": 1e3 / H})
    shape = plan_published.extra_row_shape(cells)
    assert shape["published"]["a_ms"] == pytest.approx(5) and shape["published"]["b_ms_per_layer"] == pytest.approx(2)
    assert shape["planner"]["a_ms"] == pytest.approx(10) and shape["planner"]["b_ms_per_layer"] == pytest.approx(0, abs=1e-9)
    assert shape["plain_ms_per_spilled_layer"] == pytest.approx(0.5)
    assert plan_published.extra_row_shape(cells[:2]) is None  # one spilled count: no line


def test_a_drafter_that_drafts_less_is_priced_by_its_draft_lengths(tmp_path):
    """Always k drafts: the same as no length profile; never a draft: the plain step's cost."""
    dense, _ = _pair(tmp_path, 4)
    full = plan.cell(dense, CPU, Placement(), 3, [0.5, 0.3, 0.2])
    assert plan.cell(dense, CPU, Placement(), 3, [0.5, 0.3, 0.2], len_ge=[1, 1, 1])["V_ms"] == pytest.approx(full["V_ms"])
    none = plan.cell(dense, CPU, Placement(), 3, [0.5, 0.3, 0.2], len_ge=[0, 0, 0])
    assert none["V_ms"] == pytest.approx(plan.verify_ms(dense, CPU, Placement(), 1))
    half = plan.cell(dense, CPU, Placement(), 1, [0.5], len_ge=[0.5])
    assert half["V_ms"] == pytest.approx(0.5 * plan.verify_ms(dense, CPU, Placement(), 1)
                                         + 0.5 * plan.verify_ms(dense, CPU, Placement(), 2))


def test_the_record_reads_as_one_phrase_from_a_recorded_residual():
    from pathlib import Path

    from labkit.report.plan_tables import record_line

    rec = json.loads((Path(__file__).parent / "fixtures/plancheck/residual-intel-2026-12-06.json").read_text())["residual"]
    line = record_line({"kind": "measured", "residual": rec})
    assert line == ("this box's record: verify(m) predicted within 28% median absolute error on 6 models (out of "
                    "sample 34%); the SYNTHETIC models that fit in this box's cache, measured with it flushed: within "
                    "11%; speedup within 1% (labkit plan --check, 2026-12-06 07:27:26 UTC)")
    with_cells = record_line({"kind": "measured", "residual": {**rec, "speedup_median_abs_error": 0.028,
                                                                "note": "from the previous profile of this host and build"}})
    assert with_cells.endswith("; speedup within 3% (labkit plan --check, 2026-12-06 07:27:26 UTC; from the previous "
                               "profile of this host and build)")
    assert record_line({"kind": "measured", "residual": None}) == "this box's record: never checked; run labkit plan --check"
    assert record_line({"kind": "stated"}) is None
