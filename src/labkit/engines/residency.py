"""Where llama.cpp actually put the weights: residency read from its own load log.

The worksheet asks for "spill / n-cpu-moe: from load log": what was asked (n_gpu_layers,
n_cpu_moe) is not what happened (a build without an accelerator offloads nothing; an
override can be refused; a model can have fewer layers than asked). So labkit records
both: ``asked`` from the recipe, ``placed`` parsed from the lines llama.cpp logs while it
loads a model and creates a context:

    load_tensors: layer   3 assigned to device CUDA0, is_swa = 0       (debug level)
    tensor blk.3.ffn_up_exps.weight (84 MiB q4_K) buffer type overridden to CPU
    load_tensors: offloaded 25/25 layers to GPU                          (builds with offload)
    load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
    llama_kv_cache:      CUDA0 KV buffer size =    48.00 MiB

In the chapter's terms, weights on the host while the model runs are spilled; a build
with no accelerator keeps everything on the host, which is maximum spill (not "none").
On Apple silicon host and GPU share one memory, so spill does not mean what it does on
a discrete GPU; the label says so.
"""

from __future__ import annotations

import re

NO_ACCELERATOR = "no accelerator in this build: all weights on the host — maximum spill in the chapter's terms"
UNIFIED = ("Apple unified memory: host and GPU share one memory pool, so 'spill' is not a transfer over a bus "
           "({layers} layers on the GPU)")

_LAYER = re.compile(r"layer\s+(\d+) assigned to device (\S+?),")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_MODEL_BUF = re.compile(r"^\S*load_tensors:\s+(\S+) model buffer size =\s*([\d.]+) MiB", re.M)
_KV_BUF = re.compile(r"llama_kv_cache\S*:\s+(\S+) KV buffer size =\s*([\d.]+) MiB")
_COMPUTE_BUF = re.compile(r"(\S+) compute buffer size =\s*([\d.]+) MiB")
_OVERRIDE = re.compile(r"tensor (\S+) \((\d+) MiB [^)]*\) buffer type overridden to (\S+)")
HOST_BUFFERS = ("CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "Metal_Mapped_Host")


def _add(d: dict, key: str, mib: float) -> None:
    d[key] = round(d.get(key, 0.0) + mib, 2)


def is_host(buffer: str) -> bool:
    return buffer in HOST_BUFFERS or buffer.startswith("CPU")


def parse_load_log(text: str) -> dict:
    """What llama.cpp placed where, from its load log (see the module doc for the lines)."""
    layers = {int(i): dev for i, dev in _LAYER.findall(text)}
    off = _OFFLOADED.findall(text)
    placed: dict = {"buffers_mib": {}, "kv_buffers_mib": {}, "compute_buffers_mib": {}}
    for name, mib in _MODEL_BUF.findall(text):
        _add(placed["buffers_mib"], name, float(mib))
    for name, mib in _KV_BUF.findall(text):
        _add(placed["kv_buffers_mib"], name, float(mib))
    for name, mib in _COMPUTE_BUF.findall(text):
        _add(placed["compute_buffers_mib"], name, float(mib))
    if off:
        placed["layers_offloaded"], placed["layers_total"] = int(off[-1][0]), int(off[-1][1])
    elif layers:  # no offload line: a build without GPU offload; count the per-layer devices
        placed["layers_offloaded"] = sum(1 for d in layers.values() if d != "CPU")
        placed["layers_total"] = len(layers)
    else:
        placed["layers_offloaded"] = placed["layers_total"] = None
    placed["layer_devices"] = sorted(set(layers.values()))
    ovr = _OVERRIDE.findall(text)
    placed["overridden_tensors"] = len(ovr)
    placed["overridden_mib"] = sum(int(m) for _, m, _ in ovr)
    placed["overridden_to"] = sorted({b for _, _, b in ovr})
    placed["experts_on_host"] = sum(1 for t, _, b in ovr if "_exps" in t and is_host(b))
    placed["host_model_mib"] = round(sum(v for k, v in placed["buffers_mib"].items() if is_host(k)), 2)
    placed["device_model_mib"] = round(sum(v for k, v in placed["buffers_mib"].items() if not is_host(k)), 2)
    return placed


def residency(asked: dict, placed: dict, *, gpu_offload: bool, apple: bool = False, moe: bool = False) -> dict:
    """The residency record: asked, placed, a label, and whether experts are spilled
    (the n_max protocol's guard reads ``spilled_experts``)."""
    n_on, n_all = placed.get("layers_offloaded"), placed.get("layers_total")
    if not gpu_offload:
        label, spilled = NO_ACCELERATOR, True
    elif apple:
        label, spilled = UNIFIED.format(layers=f"{n_on}/{n_all}"), False
    elif n_on is not None and n_all and n_on < n_all:
        label = (f"spilled: {n_on}/{n_all} layers on the accelerator, {placed['host_model_mib']:.0f} MiB of "
                 f"weights on the host")
        spilled = True
    elif placed.get("experts_on_host"):
        label = (f"spilled experts: {placed['experts_on_host']} expert tensors "
                 f"({placed['overridden_mib']} MiB) kept on the host (n_cpu_moe), the rest on the accelerator")
        spilled = True
    else:
        label = f"resident: {n_on}/{n_all} layers on the accelerator"
        spilled = False
    return {"asked": asked, "placed": placed, "label": label, "moe": moe, "spilled": spilled,
            "spilled_experts": bool(moe and spilled)}


def expert_patterns(n_cpu_moe: int) -> list[str]:
    """llama.cpp's --n-cpu-moe: one tensor-override regex per layer 0..N-1 (common.h)."""
    return [rf"blk\.{i}\.ffn_(up|down|gate|gate_up)_(ch|)exps" for i in range(n_cpu_moe)]
