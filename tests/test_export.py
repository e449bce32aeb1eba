"""Exports for writing and citable sections, on a real tiny reproduction (02 sweep, 06 matrix):
`labkit export` to csv/md/latex, `show`/`regen` of "LAB:RESULTS-MATRIX §E", the matrix
sections' arithmetic, PDF figures stamped with their ID, and the bad inputs."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from labkit.cli import main
from labkit.errors import LabkitError
from labkit.provenance import ids, tracking
from labkit.provenance import reproduce as rp
from labkit.report import export, matrix, printed, sections
from labkit.report.figures import pdf_lab_id
from labkit.report.queries import load_table
from labkit.report.tableformat import tex as tex_of

SWEEP = {"k": [0, 1, 2], "workloads": ["edit"], "prompts_per_workload": 1, "runs": 2, "max_tokens": 16,
         "drafters": ["ngram"], "temperatures": [0.0],
         "protocol": "full"}  # the whole grid, whatever wins on this box: these tests read its every cell


@pytest.fixture(scope="module")
def book(store):
    s = rp.reproduce(only=["02", "06"], out_dir=str(store / "out"), params=SWEEP)
    assert s["ok"], [(r["notebook"], r["error"]) for r in s["results"]]
    return {r["notebook"]: r for r in s["results"]}


def cli(capsys, *argv) -> tuple[int, list[str], str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out.splitlines(), cap.err


# -- the ID grammar -------------------------------------------------------------------
def test_section_ids_parse_and_bad_sections_list_the_real_ones():
    for text in ("LAB:RESULTS-MATRIX §E", "[LAB: RESULTS-MATRIX §E]", "RESULTS-MATRIX §e", "LAB:RESULTS-MATRIX§E"):
        ref = ids.parse_ref(text)
        assert isinstance(ref, ids.SectionId) and (ref.doc, ref.section) == ("RESULTS-MATRIX", "E"), text
        assert str(ref) == "LAB:RESULTS-MATRIX §E" and ref.cite == "[LAB:RESULTS-MATRIX §E]"
    assert ids.parse_ref("LAB:WORKSHEET §field").section == "field"
    assert ids.parse_ref("LAB:WORKSHEET").section is None
    assert ids.parse_ref("LAB:01-3fa2c1-k7q2m/cost-fit") == ids.LabId("01-3fa2c1-k7q2m", "cost-fit")
    with pytest.raises(LabkitError) as e:
        ids.parse_ref("LAB:RESULTS-MATRIX §Z")
    assert "no section §Z" in e.value.problem and all(f"§{s}" in e.value.fix for s in "ABE")
    with pytest.raises(LabkitError, match="no document 'RESULT-MATRIX'"):
        ids.parse_ref("LAB:RESULT-MATRIX §E")
    with pytest.raises(LabkitError, match="not a labkit provenance ID"):
        ids.parse_ref("LAB:1-3fa2c1-k7q2m")


# -- the sections' numbers ----------------------------------------------------------------
@pytest.mark.slow  # papermill: 02 + 06
def test_section_e_numeric_with_first_token_acceptance(book):
    c = tracking.client()
    sec = matrix.section(c, "E")
    df = sec.data
    assert sec.no_data is None and sec.sources[0]["id"] == book["02_k_sweep"]["id"]
    for col in ("tok_s", "speedup", "first_token_acceptance", "acceptance", "n_max"):
        assert pd.api.types.is_numeric_dtype(df[col]), col
    rows = load_table(c, c.get_run(book["02_k_sweep"]["run_id"]), "sweep-runs")
    for k in (1, 2):
        g = rows[(rows["k"] == k) & (~rows["cold"]) & (rows["drafter"] == "ngram")]
        # first-token acceptance from each generation's accept_by_pos[0] (vLLM's rate), pooled by its denominator
        acc0 = sum(a[0] * n[0] for a, n in zip(g["accept_by_pos"], g["drafts_reaching_pos"]) if n[0])
        want = acc0 / sum(n[0] for n in g["drafts_reaching_pos"])
        got = df[(df["drafter"] == "ngram") & (df["n_max"] == k)].iloc[0]
        assert abs(got["first_token_acceptance"] - want) < 1e-9
        assert abs(got["acceptance"] - g["accepted"].sum() / g["drafted"].sum()) < 1e-12
    assert df["host"].str.len().min() > 0 and (df["source"] == book["02_k_sweep"]["id"]).all()
    disp = matrix.display(sec)
    assert list(disp.columns[-4:]) == ["n_max=0", "n_max=1", "n_max=2", "source"]
    k1 = df[(df["n_max"] == 1)].iloc[0]
    assert disp["n_max=1"].iloc[0] == (f"{k1['tok_s']:.1f} ({k1['speedup']:.2f}×) @ "
                                       f"{k1['first_token_acceptance']:.0%} [{k1['acceptance']:.0%}]")


@pytest.mark.slow  # papermill: 02 + 06
def test_section_a_prefill_apart_from_decode(book):
    c = tracking.client()
    df = matrix.section(c, "A").data
    rows = load_table(c, c.get_run(book["02_k_sweep"]["run_id"]), "sweep-runs")
    plain = rows[(rows["drafter"] == "none") & (~rows["cold"])]  # the A/A arm (drafter "aa", k=0) is not plain
    got = df[df["drafter"] == "none"].iloc[0]
    assert got["runs"] == len(plain) == SWEEP["runs"]
    assert abs(got["prefill_tok_s"] - (plain["prompt_tokens"] / plain["ttft_ms"] * 1e3).median()) < 1e-9
    assert abs(got["ttft_ms"] - plain["ttft_ms"].median()) < 1e-12
    assert abs(got["decode_tok_s"] - plain["decode_tok_s"].median()) < 1e-12


@pytest.mark.slow  # papermill: 02 + 06
def test_section_b_without_a_concurrency_run_says_so(book, capsys):
    sec = matrix.section(tracking.client(), "B")
    assert sec.data.empty and sec.no_data.startswith("no data: no finished 07_concurrency run")
    rc, _, err = cli(capsys, "export", "LAB:RESULTS-MATRIX §B", "--format", "md")
    assert rc == 2 and "07_concurrency" in err and "fix:" in err


def test_section_b_puts_the_verdict_beside_its_own_engine_only():
    """07's verdict is reached on labkit's loop; llama-server's arm at the same (c, k) must
    not carry it (at c=4 labkit lost, 0.92x, while llama-server gained, 1.03x)."""
    conc = pd.DataFrame([{"c": c_, "k": k, "engine": e, "speedup": s} for c_ in (1, 4) for k in (0, 1)
                         for e, s in (("labkit", 0.92 if k else 1.0), ("llama-server", 1.03 if k else 1.0))])
    verdict = pd.DataFrame([{"c": 4, "k": 1, "engine": "labkit", "speedup": 0.92, "verdict": "loses at c=4"}])
    got = matrix.with_verdict(conc, verdict)
    said = got.dropna(subset=["verdict"])
    assert len(got) == len(conc) and said[["c", "k", "engine"]].values.tolist() == [[4, 1, "labkit"]]
    # a verdict table without an engine column (older runs) still lands on its (c, k)
    old = matrix.with_verdict(conc, verdict.drop(columns="engine"))
    assert old.dropna(subset=["verdict"])["engine"].tolist() == ["labkit", "llama-server"]
    assert matrix.with_verdict(conc, None) is conc


# -- export ---------------------------------------------------------------------------
@pytest.mark.slow  # papermill: 02 + 06
def test_export_a_notebook_table_in_every_format(book, capsys, tmp_path):
    c = tracking.client()
    tid = f"{book['02_k_sweep']['id']}/sweep-cells"
    logged = load_table(c, c.get_run(book["02_k_sweep"]["run_id"]), "sweep-cells")
    rc, out, _ = cli(capsys, "export", tid, "--format", "csv")
    assert rc == 0 and not out[-1].startswith("{")  # the file's text only: no JSON after it
    rc, js, _ = cli(capsys, "export", tid, "--format", "csv", "--json")
    assert rc == 0 and len(js) == 1 and json.loads(js[0])["id"] == tid and json.loads(js[0])["text"] == "\n".join(out) + "\n"
    back = pd.read_csv(io.StringIO("\n".join(out)))
    pd.testing.assert_frame_equal(back[["k", "tok_s", "speedup"]], logged[["k", "tok_s", "speedup"]])
    rc, out, _ = cli(capsys, "export", tid, "--format", "md")
    assert out[0].startswith("| drafter | workload | k |") and f"[{tid}]" in "\n".join(out)
    rc, out, err = cli(capsys, "export", tid, "--format", "latex", "--out", str(tmp_path / "cells.tex"))
    tex = (tmp_path / "cells.tex").read_text()
    assert rc == 0 and len(out) == 1 and out[0].startswith(f"wrote {tmp_path / 'cells.tex'}: [{tid}]")
    assert r"\toprule" in tex and r"tok\_\allowbreak{}s\_\allowbreak{}min" in tex
    assert tex.count(r"\\") == len(logged) + 1 and r"\caption[{sweep-cells [LAB:" in tex
    _compile(tmp_path, tex, "cells")
    # the widest logged table (per-generation lists in its cells) compiles too, wrapped
    rc, out, _ = cli(capsys, "export", f"{book['02_k_sweep']['id']}/sweep-runs", "--format", "latex")
    assert rc == 0
    _compile(tmp_path, "\n".join(out), "runs")


@pytest.mark.slow  # papermill: 02 + 06
def test_show_of_a_table_prints_its_rows(book, capsys):
    """`labkit show LAB:…/<table>` answers with the table's rows (cut to a screen), not only
    a pointer to `labkit export`; --json carries the same rows (``table_preview``)."""
    c = tracking.client()
    tid = f"{book['02_k_sweep']['id']}/sweep-cells"
    logged = load_table(c, c.get_run(book["02_k_sweep"]["run_id"]), "sweep-cells")
    rc, out, _ = cli(capsys, "show", tid)
    assert rc == 0 and out[0].startswith(f"[{tid}]") and f"{len(logged)} rows:" in out
    header = next(ln for ln in out if ln.strip().startswith("| drafter |"))
    assert "| k |" in header and out[-1].startswith("see more: labkit export")
    body = [ln for ln in out if ln.strip().startswith("| ngram |")]
    assert len(body) == min(len(logged[logged["drafter"] == "ngram"]), 12)
    rc, js, _ = cli(capsys, "show", tid, "--json")
    assert rc == 0 and len(js) == 1 and json.loads(js[0])["table_preview"] == out[2:-1]  # the same figures


def test_a_table_preview_reads_its_own_sentences_else_cuts_to_a_screen():
    from labkit.report.tableformat import preview_lines

    said = pd.DataFrame({"workload": ["edit", "code"], "ratio": [1.5, 1.0],
                         "line": ["edit: on, ngram k=5, 1.50× (98.8% CI 1.18–1.91) e2e, wins", "code: off"],
                         "check": ["edit: … held-out 1.60×: inside", None]})
    assert preview_lines(said) == [said["line"][0], "  check: edit: … held-out 1.60×: inside", "code: off"]
    wide = pd.DataFrame({f"c{i}": ["x" * 50] * 20 for i in range(14)})
    lines = preview_lines(wide)
    assert len(lines) == 2 + 12 + 1 and lines[0].count("|") == 11  # 10 columns
    assert all(len(cell.strip()) <= 36 for cell in lines[2].strip("| ").split(" | "))
    assert lines[-1] == "… 8 more rows and 4 more columns (c10, c11, c12, c13)"


@pytest.mark.slow  # papermill: 02 + 06
def test_export_matrix_section_as_latex_in_the_chapters_shape(book, capsys, tmp_path):
    """§E as a chapter prints it: model/spill · drafter · baseline · n_max=1 · n_max=2, each
    cell "tok/s (×) @ first-token %", the spill a short label whose load-log text is in the
    note; it compiles, fits the page (no overfull box) and is rendered to a PNG on request."""
    rc, out, _ = cli(capsys, "export", "LAB:RESULTS-MATRIX §E", "--format", "latex", "--out", str(tmp_path / "e.tex"),
                     "--json")
    tex = (tmp_path / "e.tex").read_text()
    assert rc == 0 and json.loads(out[-1])["id"] == "LAB:RESULTS-MATRIX §E"
    assert r"RESULTS-MATRIX $\S$E" in tex and book["02_k_sweep"]["id"] in tex
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex and r"p{\dimexpr" in tex
    head = tex.split(r"\toprule")[1].split(r"\midrule")[0]
    assert [h.strip() for h in head.replace(r"\allowbreak{}", "").split("&")] == [
        "model / spill", "drafter", "baseline tok/s", r"n\_max=1", r"n\_max=2 \\"]
    sec = matrix.section(tracking.client(), "E")
    k1 = sec.data[(sec.data["drafter"] == "ngram") & (sec.data["n_max"] == 1)].iloc[0]
    ratio = printed.ratio(k1["speedup"], k1.get("speedup_lo"), k1.get("speedup_hi"))  # with its CI where logged
    cell = (tex_of(f"{printed.rate(k1['tok_s'])} ({ratio})", breaks=True) + r"\newline "
            + tex_of(f"@ {k1['first_token_acceptance']:.0%}", breaks=True))
    assert cell in tex, cell
    label = k1["spill_label"]
    assert label.startswith("host only, 0/") and label.endswith(" layers on GPU")  # no accelerator on this box
    assert len(label) < 40 and label.replace("/", r"/\allowbreak{}") + r"\textsuperscript{a}" in tex
    note = tex.split(r"\textsuperscript{a}\,")[1].split(r"\par")[0]
    assert "(from the load log)" in note and k1["host"] in note.replace(r"\_", "_")
    pdf, log = _compile(tmp_path, tex, "e")
    assert "Overfull \\hbox" not in log, [x for x in log.splitlines() if "Overfull" in x]
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True).stdout
    assert "host only, 0/" in text and "@ " + f"{k1['first_token_acceptance']:.0%}" in text
    _screenshot(pdf, "export-E.png")


@pytest.mark.slow  # papermill: 02 + 06
def test_export_a_figure_is_a_clear_error(book, capsys):
    fid = f"{book['02_k_sweep']['id']}/tok-s-vs-k"
    rc, out, err = cli(capsys, "export", fid, "--format", "csv")
    assert rc == 2 and "names a figure, not a table" in err and f"labkit regen {fid}" in err
    with pytest.raises(LabkitError, match="has no table 'nope'") as e:
        export.resolve(tracking.client(), f"{book['02_k_sweep']['id']}/nope")
    assert "sweep-cells" in e.value.fix
    rc, _, err = cli(capsys, "export", "LAB:RESULTS-MATRIX §Q")
    assert rc == 2 and "RESULTS-MATRIX has no section §Q" in err and "§A (prefill)" in err


@pytest.mark.slow  # papermill: 02 + 06
@pytest.mark.parametrize("section", ["field", "accounting"])
def test_worksheet_exports_compile(book, tmp_path, section):
    from labkit.config.recipe import effective_recipe

    table = export.resolve(tracking.client(), f"LAB:WORKSHEET §{section}",
                           recipe=effective_recipe({"recipe": "default", **SWEEP}), owner="alice")
    tex = export.render(table, "latex")
    assert r"\toprule" in tex and r"p{\dimexpr" in tex  # its sentences wrap
    _compile(tmp_path, tex, section)


# -- LaTeX on small frames --------------------------------------------------------------
def test_spill_label_is_short_and_the_load_log_text_stays_whole():
    from labkit.engines import residency as rs
    from labkit.report import evidence

    log = ("load_tensors: offloaded 0/19 layers to GPU\n"  # SYNTHETIC load log, as llama.cpp writes it
           "load_tensors:   CPU_Mapped model buffer size =   235.16 MiB\n")
    res = rs.residency({"n_gpu_layers": 0, "n_cpu_moe": 0}, rs.parse_load_log(log), gpu_offload=False)
    assert printed.spill_label(res) == "host only, 0/19 layers on GPU"
    assert "CPU_Mapped 235 MiB" in evidence.residency_text(res)  # the full text, for the note
    part = rs.residency({}, rs.parse_load_log(log.replace("0/19", "12/19")), gpu_offload=True)
    assert printed.spill_label(part) == "spilled, 12/19 layers on GPU"
    full = rs.residency({}, rs.parse_load_log(log.replace("0/19", "19/19")), gpu_offload=True)
    assert printed.spill_label(full) == "on GPU, 19/19 layers on GPU"
    assert printed.spill_label({"layers_on_accelerator": 0, "layers_on_host": 18}) == (
        "host only, 0/18 layers on GPU (as asked)")
    assert printed.spill_label(None) == "not recorded"


def test_a_ratio_prints_beside_its_interval_when_the_table_has_one():
    from labkit.report.tableformat import _readable

    df = pd.DataFrame({"arm": ["ngram"], "speedup": [0.9612], "speedup_lo": [0.931], "speedup_hi": [0.992],
                       "tok_s": [41.234]})
    assert _readable(df).to_dict("records") == [{"arm": "ngram", "speedup": "0.96×\u00a0[0.93–0.99]", "tok_s": "41.23"}]
    assert _readable(df.drop(columns=["speedup_lo", "speedup_hi"]))["speedup"].tolist() == ["0.9612"]
    est = pd.DataFrame({"e2e_ratio": [1.04], "e2e_lo": [1.01], "e2e_hi": [1.08], "e2e_verdict": ["wins"]})
    assert _readable(est).columns.tolist() == ["e2e_ratio", "e2e_verdict"]
    assert _readable(est)["e2e_ratio"].iloc[0] == "1.04×\u00a0[1.01–1.08]"
    fit = pd.DataFrame({"term": ["V"], "estimate": [2.5], "ci_low": [2.25], "ci_high": [2.75]})  # not a ratio
    assert _readable(fit)["estimate"].iloc[0] == "2.5 [2.25–2.75]"
    e = _e_frame(ci=True)
    cell = printed.chapter_e(e).rows[0][3]
    assert cell == "36.1 (0.98×\u00a0[0.93–0.99])\n@ 89%"  # a ratio never parts from its CI
    assert printed.chapter_e(_e_frame(ci=False)).rows[0][3] == "36.1 (0.98×)\n@ 89%"


def _e_frame(*, ci: bool) -> pd.DataFrame:
    """SYNTHETIC §E rows: plain and ngram n_max=1, 2 on one model."""
    rows = [{"recipe": "default", "host": "box", "model": "gemma-3-270m Q4_K_M", "model_sha256": "a5fd3b62a5fd",
             "spill": "no accelerator in this build: …; 0/19 layers offloaded (from the load log)",
             "spill_label": "host only, 0/19 layers on GPU", "box": "3% by others", "drafter": d, "n_max": k,
             "tok_s": 35.1 + k, "speedup": 0.96 + k / 50, "first_token_acceptance": 0.89 if k else None,
             "source": "LAB:02-017462-fuejt", **({"speedup_lo": 0.93, "speedup_hi": 0.99} if ci else {})}
            for d, k in (("none", 0), ("ngram", 1), ("ngram", 2))]
    return pd.DataFrame(rows)


def test_latex_escapes_what_a_cell_can_hold_and_compiles(tmp_path):
    from labkit.report.tableformat import latex

    nasty = "50% & $5 #1 _x_ {a} ~ ^ \\ § × – — · … ± ≤ ≥ → < > | \" µ é 中 \n next"
    p = printed.Printed(columns=["what_it_is", "value"], rows=[[nasty, "0.96× [0.93–0.99]"],
                        ["LAB:02-017462-fuejt/sweep-cells/" + "long/" * 12, "1"]], numeric=[False, True],
                        notes=["a note with 100% & more"], legend="legend_with #")
    tex = latex(p, caption="cap [LAB:X §E]", label="LAB:X §E")
    pdf, _ = _compile(tmp_path, tex, "nasty")
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout
    for piece in ("50% & $5 #1", "{a}", "§", "0.93–0.99", "a note with 100% & more"):
        assert piece in text, piece
    # a cell taller than a page becomes a longtable that breaks across pages
    tall = printed.Printed(columns=["i", "text"], rows=[[str(i), "word " * 30] for i in range(60)],
                           numeric=[True, False])
    tex = latex(tall, caption="tall", label="tall")
    assert r"\begin{longtable}" in tex and r"\endhead" in tex
    pdf, _ = _compile(tmp_path, tex, "tall")
    pages = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True).stdout
    assert int(re.search(r"Pages:\s+(\d+)", pages).group(1)) > 1


def _compile(tmp_path, tex: str, name: str):
    """``tex`` \\input into a book page with the packages its first line names, as an
    author would; (the PDF, pdflatex's log). Skips when pdflatex is not installed."""
    if shutil.which("pdflatex") is None or shutil.which("pdftotext") is None:
        pytest.skip("pdflatex/pdftotext not installed: apt-get install texlive-latex-base texlive-latex-recommended "
                    "poppler-utils (scripts/system-deps.sh)")
    m = re.match(r"% labkit export: needs \\usepackage\{([^}]*)\}$", tex.splitlines()[0])
    assert m, tex.splitlines()[0]
    (tmp_path / f"{name}.tex").write_text(tex)
    (tmp_path / f"{name}-doc.tex").write_text(
        "\\documentclass{book}\n\\usepackage{" + m.group(1) + "}\n\\pagestyle{empty}\n\\begin{document}\n"
        "\\input{" + name + ".tex}\n\\end{document}\n")
    r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", f"{name}-doc.tex"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:]
    return tmp_path / f"{name}-doc.pdf", (tmp_path / f"{name}-doc.log").read_text(errors="replace")


def _screenshot(pdf, name: str) -> None:
    """With UI_SCREENSHOTS=<dir> (as tests/test_mlflow_ui.py), the PDF's first page as a PNG
    cropped to what is printed on it."""
    where = os.environ.get("UI_SCREENSHOTS")
    if not where:
        return
    from PIL import Image, ImageOps

    stem = pdf.with_name(pdf.stem + "-page")
    subprocess.run(["pdftoppm", "-r", "200", "-png", "-f", "1", "-l", "1", "-singlefile", str(pdf), str(stem)],
                   check=True, timeout=60)
    page = Image.open(f"{stem}.png").convert("RGB")
    box = ImageOps.invert(page.convert("L")).getbbox()
    pad = 30
    Path(where).mkdir(parents=True, exist_ok=True)
    page.crop((box[0] - pad, box[1] - pad, box[2] + pad, box[3] + pad)).save(Path(where) / name)


# -- citable sections: show and regen ---------------------------------------------------
@pytest.mark.slow  # papermill: 02 + 06
def test_show_and_regen_a_matrix_section(book, capsys, tmp_path):
    rc, out, _ = cli(capsys, "show", "LAB:RESULTS-MATRIX §E", "--json")
    doc = json.loads(out[-1])
    assert rc == 0 and doc["id"] == "LAB:RESULTS-MATRIX §E" and doc["no_data"] is None
    assert [s["id"] for s in doc["sources"]] == [book["02_k_sweep"]["id"]]
    assert doc["sources"][0]["tables"] == ["sweep-cells", "sweep-runs"]
    assert doc["logged_as"] == f"{book['06_results_matrix']['id']}/results-matrix-E"
    rc, out, _ = cli(capsys, "regen", "LAB:RESULTS-MATRIX §E", "--out", str(tmp_path), "--json")
    res = json.loads(out[-1])
    assert rc == 0 and res["identical"] is True and res["compared_with"] == doc["logged_as"]
    assert (tmp_path / "RESULTS-MATRIX-E" / "table.csv").read_text() == export.render(
        sections.build(tracking.client(), ids.parse_ref("LAB:RESULTS-MATRIX §E")), "csv")
    rc, out, _ = cli(capsys, "show", "LAB:RESULTS-MATRIX", "--json")
    assert rc == 0 and set(json.loads(out[-1])["sections"]) == {"§A", "§B", "§E"}
    rc, _, err = cli(capsys, "regen", "LAB:RESULTS-MATRIX")
    assert rc == 2 and "needs one section" in err


@pytest.mark.slow  # papermill: 02 + 06
def test_regen_notices_a_section_that_changed(book, tmp_path):
    """A logged copy that no longer matches the runs is reported as not identical."""
    c = tracking.client()
    sid = ids.parse_ref("LAB:RESULTS-MATRIX §A")
    assert sections.regen(c, sid, out_dir=tmp_path)["identical"] is True
    run = c.get_run(book["06_results_matrix"]["run_id"])
    from labkit.provenance import frames

    old = load_table(c, run, "results-matrix-A")
    c.log_text(run.info.run_id, frames.frame_to_json(old.assign(ttft_ms=old["ttft_ms"] + 1)),
               "tables/results-matrix-A/data.json")
    assert sections.regen(c, sid, out_dir=tmp_path)["identical"] is False


# -- figures for writing ----------------------------------------------------------------
@pytest.mark.slow  # papermill: 02 + 06
def test_figures_are_logged_as_pdf_stamped_with_their_id(book, tmp_path):
    c = tracking.client()
    fid = f"{book['02_k_sweep']['id']}/tok-s-vs-k"
    pdf = c.download_artifacts(book["02_k_sweep"]["run_id"], "figures/tok-s-vs-k/figure.pdf", str(tmp_path))
    assert open(pdf, "rb").read(5) == b"%PDF-" and pdf_lab_id(pdf) == fid
    assert f"/Keywords ({fid})".encode() in open(pdf, "rb").read()
    from labkit.report.regen import regen

    res = regen(fid, out_dir=tmp_path / "regen")
    pdfs = [f for f in res["regenerated"][0]["files"] if f.endswith(".pdf")]
    assert len(pdfs) == 1 and pdf_lab_id(pdfs[0]) == fid


def test_export_imports_no_engine_or_matplotlib():
    code = ("import sys, labkit.commands.export; "
            "bad = [m for m in ('matplotlib', 'llama_cpp', 'labkit.decoding.loop') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
