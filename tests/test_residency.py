"""Residency on llama.cpp: asked (n_gpu_layers, n_cpu_moe) vs placed, read from the load log.

Parsing is checked on load logs recorded on this CPU box and on hand-written CUDA-style
logs (labelled HAND-WRITTEN in tests/fixtures/loadlog/: no CUDA build exists here), and
live on the real engine: the embedded model, and the zoo's SYNTHETIC MoE with experts
kept on the host through the same tensor-buffer overrides as llama.cpp's --n-cpu-moe.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.artifacts import zoo
from labkit.engines import residency as rs
from labkit.engines.llamacpp import LlamaCppEngine, build_info
from labkit.errors import LabkitError

LOGS = Path(__file__).parent / "fixtures" / "loadlog"


def log(name: str) -> str:
    return (LOGS / name).read_text()


def test_recorded_cpu_log_of_the_embedded_model():
    placed = rs.parse_load_log(log("cpu_gemma-3-270m-q4_k_m.txt"))
    assert placed["buffers_mib"] == {"CPU_Mapped": 235.16, "CPU_REPACK": 12.66}
    assert placed["layers_total"] == 19 and placed["layers_offloaded"] == 0  # 18 blocks + the output layer
    assert placed["layer_devices"] == ["CPU"] and placed["device_model_mib"] == 0
    assert placed["kv_buffers_mib"] == {"CPU": 9.0}  # the non-SWA and SWA caches, summed
    assert placed["overridden_tensors"] == 0
    res = rs.residency({"n_gpu_layers": 0, "n_cpu_moe": 0}, placed, gpu_offload=False)
    assert res["label"] == rs.NO_ACCELERATOR
    assert "maximum spill" in res["label"] and "none" not in res["label"]
    assert res["spilled"] and not res["spilled_experts"]  # dense: there are no experts to spill


def test_recorded_cpu_log_with_experts_overridden():
    placed = rs.parse_load_log(log("cpu_synthetic-moe_n-cpu-moe-1.txt"))
    assert placed["overridden_tensors"] == 3 and placed["experts_on_host"] == 3  # gate, up, down of layer 0
    assert placed["overridden_mib"] == 12
    res = rs.residency({"n_cpu_moe": 1}, placed, gpu_offload=False, moe=True)
    assert res["spilled_experts"] and res["label"] == rs.NO_ACCELERATOR


def test_handwritten_cuda_partial_offload_is_spill():
    placed = rs.parse_load_log(log("cuda_dense-partial_HANDWRITTEN.txt"))
    assert (placed["layers_offloaded"], placed["layers_total"]) == (20, 33)
    assert placed["buffers_mib"] == {"CUDA0": 2871.25, "CPU_Mapped": 1989.75}
    assert placed["host_model_mib"] == 1989.75 and placed["device_model_mib"] == 2871.25
    assert placed["compute_buffers_mib"] == {"CUDA0": 560.0, "CUDA_Host": 24.01}
    res = rs.residency({"n_gpu_layers": 20}, placed, gpu_offload=True)
    assert res["label"].startswith("spilled: 20/33 layers") and "1990 MiB" in res["label"]
    assert res["spilled"] and not res["spilled_experts"]


def test_handwritten_cuda_moe_with_experts_on_host():
    placed = rs.parse_load_log(log("cuda_moe-n-cpu-moe_HANDWRITTEN.txt"))
    assert (placed["layers_offloaded"], placed["layers_total"]) == (25, 25)
    assert placed["experts_on_host"] == 6 and placed["overridden_mib"] == 2 * (432 + 630 + 432)
    res = rs.residency({"n_gpu_layers": -1, "n_cpu_moe": 2}, placed, gpu_offload=True, moe=True)
    assert res["label"].startswith("spilled experts: 6 expert tensors") and res["spilled_experts"]
    # the same placement without the overrides is resident
    clean = dict(placed, experts_on_host=0, overridden_tensors=0, overridden_mib=0)
    assert rs.residency({}, clean, gpu_offload=True, moe=True)["label"] == "resident: 25/25 layers on the accelerator"


def test_apple_unified_memory_is_named():
    placed = rs.parse_load_log(log("cuda_dense-partial_HANDWRITTEN.txt").replace("CUDA0", "MTL0"))
    res = rs.residency({}, placed, gpu_offload=True, apple=True)
    assert res["label"].startswith("Apple unified memory") and "20/33" in res["label"]
    assert not res["spilled"]


def test_live_residency_of_the_embedded_model(engine):
    res = engine.describe()["residency"]
    assert res["placed"] == rs.parse_load_log(engine.load_log)
    assert res["asked"] == {"n_gpu_layers": 0, "n_cpu_moe": 0}
    assert res["placed"]["layers_total"] == engine._lc.llama_model_n_layer(engine.model) + 1
    assert sum(res["placed"]["buffers_mib"].values()) > 200  # the 253 MB model's weights are somewhere
    if not build_info()["gpu_offload_supported"]:
        assert res["label"] == rs.NO_ACCELERATOR and res["placed"]["layers_offloaded"] == 0


def test_live_expert_offload_on_a_moe_model():
    art = zoo.get("synthetic-moe")
    with LlamaCppEngine(art.path, n_ctx=256, n_threads=1, n_cpu_moe=2) as e:
        res = e.describe()["residency"]
        assert res["asked"]["n_cpu_moe"] == 2 and res["moe"]
        n_moe_layers = sum(1 for i in range(e._lc.llama_model_n_layer(e.model))
                           if f"blk.{i}.ffn_up_exps" in e.load_log)
        assert res["placed"]["experts_on_host"] == 3 * min(2, n_moe_layers)
        assert res["spilled_experts"]


def test_expert_offload_on_a_dense_model_is_refused(embedded):
    with pytest.raises(LabkitError) as e:
        LlamaCppEngine(embedded.path, n_ctx=256, n_threads=1, n_cpu_moe=1)
    assert "dense model" in e.value.problem and "drop n_cpu_moe" in e.value.fix


def test_mtp_on_a_model_without_nextn_layers_is_refused(embedded):
    with pytest.raises(LabkitError) as e:
        LlamaCppEngine(embedded.path, n_ctx=256, n_threads=1, load_mtp=True)
    assert "no MTP (nextn) layers" in e.value.problem and "drop 'mtp'" in e.value.fix
