"""One llama.cpp build per machine, for the Python engine and the tools (engines/native.py).

The real build (made by `make setup`) is checked as it is: Python's libllama is the file
llama-server links. The cache's bad states (damaged, interrupted, a tool missing, another
LLAMA_CPP_LIB_PATH) are made on copies, never on the real cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.artifacts import server_build
from labkit.engines import native
from labkit.errors import LabkitError


@pytest.fixture(scope="module")
def built():
    info = native.find(verify=True)
    assert info is not None and not info["missing"], (
        f"no finished llama.cpp build in {native.build_dir()}: `make setup` builds it")
    return info


def test_python_loads_the_very_libllama_the_tools_link(engine, built):
    b = engine.describe()["build"]
    lib = Path(built["bin"]) / native.lib_name("llama")
    assert b["one_build"] is True, b.get("one_build_why")
    assert Path(b["lib_path"]) == lib.resolve() and b["lib_sha256"] == built["sha256"]["libllama.so"]
    # the dynamic linker resolves llama-server's libllama to the same file (RPATH $ORIGIN)
    ldd = subprocess.run(["ldd", str(Path(built["bin"]) / "llama-server")], capture_output=True, text=True).stdout
    hits = [ln.split("=>")[1].split("(")[0].strip() for ln in ldd.splitlines() if "libllama.so" in ln]
    assert hits and Path(hits[0]).resolve() == lib.resolve(), ldd
    # llama-cpp-python's own lib directory holds links into the build, not a copy of its own
    assert (native.python_lib_dir() / "libllama.so").resolve() == lib.resolve()


def test_every_file_is_recorded_with_its_checksum(built):
    assert set(built["sha256"]) == {native.lib_name(x) for x in native.LIBS} | set(native.TOOLS)
    assert len(built["llama_cpp_commit"]) == 40 and "GGML_NATIVE=OFF" in built["cmake_args"]
    assert {"source_s", "configure_s", "compile_s"} <= set(built["stages"])


def test_server_build_is_a_no_op_once_built(built):
    info = server_build.build()
    assert info["cached"] is True and info["path"] == str(Path(built["bin"]) / "llama-server")
    assert server_build.find()["llama_cpp_commit"] == built["llama_cpp_commit"]


def _ninja_objects(build: Path) -> set[str]:
    """The object files build.ninja makes, as paths under the build folder."""
    text = (build / "build.ninja").read_text()
    return {ln.split()[1].rstrip(":") for ln in text.splitlines() if ln.startswith("build ") and ".o:" in ln.split()[1]}


def test_the_unity_build_groups_only_code_no_timed_path_runs(built):
    """The installed build: llama-common and mtmd compiled as unity builds, every file a token
    passes through (UNITY_OWN) compiled on its own, and ggml, libllama's own grouping and the
    server's libraries as the pinned CMakeLists make them."""
    assert built["unity"]["sha256"] == native.unity()["sha256"] and not built["unity"].get("skipped")
    objs = _ninja_objects(Path(built["dir"]) / "build")
    unity = {o for o in objs if "/Unity/unity_" in o}
    grouped = {o.split("/CMakeFiles/")[1].split(".dir/")[0] for o in unity}
    assert grouped == {*native.UNITY_TARGETS, "llama"}  # libllama: upstream's own UNITY_BUILD
    for target, files in native.UNITY_OWN.items():
        for f in files:
            assert any(o.endswith(f"/{target}.dir/{Path(f).name}.o") for o in objs), (target, f)
    assert not any(o.startswith(("ggml/", "tools/server/")) for o in unity)
    assert "common/CMakeFiles/llama-common.dir/arg.cpp.o" not in objs  # grouped, not its own compile


def test_a_unity_file_the_sources_lack_stops_the_configure_with_the_fix(tmp_path):
    """CMake itself, on a SYNTHETIC project named llama.cpp with llama-common and mtmd: a file
    UNITY_OWN names and the sources lack (a new pin moved it) stops the configure naming it
    and the fix; with every file there, llama-common gets its unity sources."""
    why = native.unity_unsupported()
    if why:
        pytest.skip(f"no unity build here: {why}")
    src = tmp_path / "src"
    files = [f for fs in native.UNITY_OWN.values() for f in fs] + ["common/arg.cpp", "common/chat.cpp",
                                                                   "tools/mtmd/clip.cpp"]
    for i, f in enumerate(files):
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        (src / f).write_text(f"int f_{i}() {{ return 0; }}\n")
    common = " ".join(f for f in files if f.startswith("common/"))
    mtmd = " ".join(f for f in files if f.startswith("tools/"))
    (src / "CMakeLists.txt").write_text(
        f"cmake_minimum_required(VERSION 3.19)\nproject(\"llama.cpp\" CXX)\n"
        f"add_library(llama-common STATIC {common})\nadd_library(mtmd STATIC {mtmd})\n")
    include = native.unity_args(tmp_path)

    def configure(build: str) -> subprocess.CompletedProcess:
        return subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / build), *include], capture_output=True,
                              text=True, timeout=120)

    ok = configure("ok")
    assert ok.returncode == 0, ok.stderr
    unity = list((tmp_path / "ok").rglob("llama-common.dir/Unity/unity_*_cxx.cxx"))
    assert len(unity) == 1 and "arg.cpp" in unity[0].read_text() and "sampling.cpp" not in unity[0].read_text()
    (src / "common/sampling.cpp").unlink()
    moved = configure("moved")
    assert moved.returncode != 0
    said = " ".join(moved.stderr.split())
    assert "common/sampling.cpp is not in these llama.cpp sources" in said and "native.UNITY_OWN" in said


def test_another_unity_build_is_another_cached_build(monkeypatch):
    before = native.key(native.PORTABLE_FLAGS)
    monkeypatch.setattr(native, "UNITY_OWN", {**native.UNITY_OWN, "llama-common": native.UNITY_OWN["llama-common"][1:]})
    assert native.key(native.PORTABLE_FLAGS) != before


def _fake_cache(tmp_path, monkeypatch) -> Path:
    """A finished build's layout with small stand-in files (SYNTHETIC: no compile)."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    d = native.build_dir()
    bindir = d / "build" / "bin"
    bindir.mkdir(parents=True)
    sums = {}
    for name in [native.lib_name(x) for x in native.LIBS] + list(native.TOOLS):
        (bindir / name).write_bytes(name.encode())
        sums[name] = native.sha256(bindir / name)
    (d / "build.json").write_text(json.dumps({"llama_cpp_commit": "x" * 40, "cmake_args": "", "sha256": sums}))
    return d


def _build_without_cmake(monkeypatch, tmp_path) -> list[str]:
    """``native.build`` with no cmake on PATH: it stops at its first step, before any compile,
    with the error that names cmake; returns what it said before that."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    said = []
    with pytest.raises(LabkitError, match="cmake is not installed"):
        native.build(progress=said.append)
    return said


def test_a_damaged_cache_is_named_and_rebuilt_from_scratch(tmp_path, monkeypatch):
    d = _fake_cache(tmp_path, monkeypatch)
    assert native.find(verify=True)["missing"] == []
    (d / "build" / "bin" / "libllama.so").write_bytes(b"corrupted")
    with pytest.raises(native.DamagedBuild) as e:
        native.find(verify=True)
    assert e.value.files == ["libllama.so"] and "libllama.so" in e.value.problem
    said = _build_without_cmake(monkeypatch, tmp_path)
    assert any("damaged" in s and "rebuilding from scratch" in s for s in said), said
    assert not (d / "build.json").exists()  # the damaged build is gone, never used again


def test_an_interrupted_build_is_never_used_and_is_resumed(tmp_path, monkeypatch):
    d = _fake_cache(tmp_path, monkeypatch)
    (d / "build.json").unlink()  # what Ctrl-C leaves: objects, no record
    (d / "build" / "CMakeCache.txt").write_text("")
    assert native.find() is None and server_build.find() is None
    with pytest.raises(LabkitError, match="llama-server is not built"):
        native.tool("llama-server")
    said = _build_without_cmake(monkeypatch, tmp_path)
    assert any("resuming the unfinished build" in s for s in said), said


def test_a_tool_missing_from_an_old_cache_is_built_alone(tmp_path, monkeypatch):
    d = _fake_cache(tmp_path, monkeypatch)
    (d / "build" / "bin" / "llama-batched-bench").unlink()
    assert native.find()["missing"] == ["llama-batched-bench"]
    assert native.tool("llama-bench").is_file()
    with pytest.raises(LabkitError, match="llama-batched-bench is not built") as e:
        native.tool("llama-batched-bench")
    assert "make setup" in e.value.fix
    said = _build_without_cmake(monkeypatch, tmp_path)
    assert any("lacks llama-batched-bench: building just those" in s for s in said), said


def _copy_libs(built: dict, dest: Path) -> Path:
    """The build's libraries copied into ``dest``: the same bytes at another path."""
    dest.mkdir(parents=True)
    for so in Path(built["bin"]).glob("lib*.so*"):
        shutil.copy2(so, dest / so.name)
    return dest


def _build_info_with(lib_dir: Path) -> subprocess.CompletedProcess:
    """``build_info()`` printed as JSON by a process whose LLAMA_CPP_LIB_PATH is ``lib_dir``."""
    return subprocess.run([sys.executable, "-c", "import json; from labkit.engines.llamacpp import build_info; "
                           "print(json.dumps(build_info()))"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LLAMA_CPP_LIB_PATH": str(lib_dir)})


def test_another_llama_cpp_lib_path_is_recorded_and_warned(built, tmp_path):
    other = _copy_libs(built, tmp_path / "other-build")  # not the tools' file
    p = _build_info_with(other)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["one_build"] is False and info["lib_path"] == str((other / "libllama.so").resolve())
    assert info["lib_path_env"] == str(other) and str(other) in info["one_build_why"]
    assert "WARNING" in p.stderr and "LLAMA_CPP_LIB_PATH" in p.stderr
    # not a labkit build (no build.json beside it): its flags and patches are unknown, never
    # the installed build's (which would put the wrong build on every number)
    assert info["patches"] is None and info["cmake_args"].startswith("unknown:")
    assert "unknown patches" in p.stderr


def test_an_unpatched_labkit_build_on_llama_cpp_lib_path_is_recorded_as_unpatched(built, tmp_path):
    """A copy laid out as a labkit build (<dir>/build/bin, build.json) whose record carries no
    patches, as a build from before the kernel patch: the run records no patches and its own
    flags, and the warning names what it lacks and the fix."""
    top = tmp_path / "llama.cpp-old"
    other = _copy_libs(built, top / "build" / "bin")
    rec = {k: v for k, v in json.loads((Path(built["dir"]) / "build.json").read_text()).items() if k != "patches"}
    (top / "build.json").write_text(json.dumps({**rec, "cmake_args": "-DGGML_NATIVE=OFF (the old build)"}))
    p = _build_info_with(other)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["one_build"] is False and info["patches"] == [] and info["cmake_args"] == "-DGGML_NATIVE=OFF (the old build)"
    assert info["dir"] == str(top)
    assert "carries no patches, not labkit's tinyblas-q0-small-n.patch" in p.stderr and "make setup" in p.stderr


def test_the_setup_entry_point_runs_without_numpy(tmp_path):
    """scripts/setup.sh runs native.py as a file before the venv has any dependency."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "src", "LABKIT_CACHE": str(tmp_path), "HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-S", "-B", "src/labkit/engines/native.py", "--flags", "",
                        "status"], capture_output=True, text=True, env=env, cwd=Path(__file__).parents[1])
    assert p.returncode == 1 and json.loads(p.stdout)["built"] is False, p.stderr


def test_sdist_cached_is_named_and_a_failed_download_says_the_fix(tmp_path):
    """`native sdist` (setup.sh's one download path): a cached sdist is printed without pip; a
    download that cannot reach the index exits 2 with the problem, the fix and no file left."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "src", "LABKIT_CACHE": str(tmp_path), "HOME": str(tmp_path),
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "", "PIP_NO_INDEX": "0",
           "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "PIP_CONFIG_FILE": os.devnull}
    cmd = [sys.executable, "-S", "-B", "src/labkit/engines/native.py", "--flags", "", "sdist"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=Path(__file__).parents[1], timeout=120)
    assert p.returncode == 2 and "could not download the llama-cpp-python" in p.stderr, p.stderr
    assert "fix: check that pip can reach the package index" in p.stderr
    assert not list((tmp_path / "sdist").glob("*.tar.gz"))
    cached = tmp_path / "sdist" / f"llama_cpp_python-{native.VERSION}.tar.gz"
    cached.write_bytes(b"a cached sdist")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=Path(__file__).parents[1], timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == str(cached) and "downloading" not in p.stderr, p.stderr


# lines as CMake's two generators print them (copied from this version's build logs)
MAKE_LINES = ["[  4%] Building CXX object ggml/src/CMakeFiles/ggml-base.dir/ggml.cpp.o",
              "[  4%] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o",
              "[ 11%] Linking CXX shared library bin/libggml-base.so", "[ 11%] Built target ggml-base"]
NINJA_LINES = ["[1/222] Building CXX object ggml/src/CMakeFiles/ggml-base.dir/ggml.cpp.o",
               "[11/222] Linking CXX shared library bin/libggml-base.so.0.25.3",
               "[31/222] Linking CXX shared library bin/libggml-cpu.so.0.25.3"]


def test_progress_counts_make_lines_and_reads_ninjas_own_count(tmp_path):
    said = []
    make = native._Meter(said.append, tmp_path / "build.log", expected=215, every_s=0)
    for line in MAKE_LINES:
        make(line)
    assert make.steps == 3 and make.expected == 215  # "Built target" is not a step
    assert said[-1].startswith("compiling: step 3 of ~215 after ")
    ninja = native._Meter(said.append, tmp_path / "build.log", expected=215, every_s=0)
    for line in NINJA_LINES:
        ninja(line)
    assert (ninja.steps, ninja.expected) == (31, 222) and said[-1].startswith("compiling: step 31 of ~222 after ")


def test_an_unfinished_build_resumes_with_the_generator_it_was_configured_with(tmp_path, monkeypatch):
    build = tmp_path / "build"
    build.mkdir()
    (build / "CMakeCache.txt").write_text("CMAKE_BUILD_TYPE:STRING=Release\nCMAKE_GENERATOR:INTERNAL=Unix Makefiles\n")
    assert native.generator(build) == "Unix Makefiles"  # whatever is installed now
    (build / "CMakeCache.txt").write_text("CMAKE_GENERATOR:INTERNAL=Ninja\n")
    assert native.generator(build) == "Ninja"
    # a new build: Ninja where it is on PATH, else Make
    monkeypatch.setenv("PATH", str(tmp_path))
    assert native.generator(tmp_path / "none") == "Unix Makefiles"
    (tmp_path / "ninja").write_text("#!/bin/sh\n")
    (tmp_path / "ninja").chmod(0o755)
    assert native.generator(tmp_path / "none") == "Ninja"
    assert native.generator() == "Ninja"


SGEMM = "ggml/src/ggml-cpu/llamafile/sgemm.cpp"


def _pinned_sgemm(dest: Path) -> Path:
    """The pinned sdist's sgemm.cpp alone, at its place in a tree rooted at ``dest``."""
    import tarfile

    sdist = native.cache_dir() / "sdist" / f"llama_cpp_python-{native.VERSION}.tar.gz"
    if not sdist.is_file():
        pytest.skip(f"no sdist at {sdist} (`make setup` downloads it)")
    with tarfile.open(sdist) as tf:
        member = tf.getmember(f"llama_cpp_python-{native.VERSION}/vendor/llama.cpp/{SGEMM}")
        data = tf.extractfile(member).read()
    (dest / SGEMM).parent.mkdir(parents=True)
    (dest / SGEMM).write_bytes(data)
    return dest / SGEMM


def test_the_patches_apply_to_the_pinned_sources_and_are_recorded(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # the sdist's own .git sits above its tree
    src = tmp_path / "src"
    f = _pinned_sgemm(src)
    before = f.read_text()
    applied = native.apply_patches(src, tmp_path / "build.log")
    assert [p["name"] for p in applied] == list(native.PATCHES)
    assert "gemm1xN<8, 8>" in f.read_text() and "gemm1xN<8, 8>" not in before
    p = applied[0]
    assert p["sha256"] == native.sha256(native.PATCHES_DIR / p["name"])
    assert "ggml-org/llama.cpp#10714" in p["upstream"] and "ggml-org/llama.cpp#10343" in p["upstream"]


def test_a_patch_that_no_longer_applies_stops_the_build_with_the_fix(tmp_path):
    src = tmp_path / "src"
    f = _pinned_sgemm(src)
    f.write_text(f.read_text().replace("NOINLINE void gemm4xN", "NOINLINE void gemm4xN_moved"))  # a new pin
    with pytest.raises(LabkitError, match="does not apply to the pinned sources") as e:
        native.apply_patches(src, tmp_path / "build.log")
    assert "ggml-org/llama.cpp#10714" in e.value.fix and "native.PATCHES" in e.value.fix
    assert "gemm1xN<8, 8>" not in f.read_text()  # all or nothing: the tree is left as it was


def test_another_patch_is_another_cached_build(tmp_path, monkeypatch):
    before = native.key(native.PORTABLE_FLAGS)
    patches = tmp_path / "patches"
    shutil.copytree(native.PATCHES_DIR, patches)
    monkeypatch.setattr(native, "PATCHES_DIR", patches)
    assert native.key(native.PORTABLE_FLAGS) == before
    p = patches / native.PATCHES[0]
    p.write_text(p.read_text().replace("labkit:", "labkit (edited):", 1))
    assert native.key(native.PORTABLE_FLAGS) != before
    p.unlink()
    with pytest.raises(LabkitError, match="is missing"):
        native.key(native.PORTABLE_FLAGS)


# CPU feature sets, constructed (labelled): the features each ggml flag needs, as /proc/cpuinfo names them
ZEN3 = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}
ZEN5 = ZEN3 | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi", "avx512_vnni", "avx512_bf16"}
SAPPHIRE = ZEN5 | {"avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}


def test_the_variant_is_what_the_cpu_has_and_never_amx():
    assert native.variant_flags(ZEN3) == native.PORTABLE_FLAGS
    assert native.variant_flags(ZEN5) == (native.PORTABLE_FLAGS + " -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON "
                                          "-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON")
    spr = native.variant_flags(SAPPHIRE)
    assert "AMX" not in spr and "-DGGML_AVX_VNNI=ON" in spr and "-DGGML_AVX512_VNNI=ON" in spr
    # an AVX-512 extension without the AVX-512 base set ggml compiles with: neither
    assert "AVX512" not in native.variant_flags(ZEN3 | {"avx512f", "avx512_vnni"})
    assert native.cpu_features("processor\t: 0\nflags\t\t: fpu avx2 fma\n") == {"fpu", "avx2", "fma"}
    assert native.cpu_features("processor\t: 0\n") is None


def test_setup_builds_portable_unless_asked_for_the_cpus_variant_and_refuses_an_unknown_one(monkeypatch):
    monkeypatch.delenv("LABKIT_CPU_VARIANT", raising=False)
    assert native.default_flags() == native.PORTABLE_FLAGS
    monkeypatch.setenv("LABKIT_CPU_VARIANT", "cpu")
    assert native.default_flags() == native.variant_flags(native.cpu_features())
    monkeypatch.setenv("LABKIT_CPU_VARIANT", "avx512")
    with pytest.raises(LabkitError, match="LABKIT_CPU_VARIANT='avx512'") as e:
        native.default_flags()
    assert "portable" in e.value.fix and "cpu" in e.value.fix
    # setup.sh's own call: the message and a non-zero exit, no flags printed to fall back on
    p = subprocess.run([sys.executable, "-S", "-B", "src/labkit/engines/native.py", "cpu-flags"], capture_output=True,
                       text=True, cwd=Path(__file__).parents[1], timeout=60,
                       env={"PATH": os.environ["PATH"], "PYTHONPATH": "src", "LABKIT_CPU_VARIANT": "avx512"})
    assert p.returncode == 2 and p.stdout == "" and "LABKIT_CPU_VARIANT" in p.stderr


def test_this_cpu_runs_its_own_variant_and_the_installed_build(built):
    feats = native.cpu_features()
    assert feats is not None, "no /proc/cpuinfo flags on this Linux box"
    assert native.missing_features(native.variant_flags(feats), feats) == []
    native.check_cpu(built["cmake_args"])  # the installed build runs here: no error


def test_a_build_for_features_this_cpu_lacks_is_refused_with_the_fix(tmp_path):
    avx512 = native.PORTABLE_FLAGS + " -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON"
    with pytest.raises(LabkitError, match=r"-DGGML_AVX512=ON.*this CPU lacks avx512_vnni, avx512bw, avx512cd, avx512dq, avx512f") as e:
        native.check_cpu(avx512, features=ZEN3)
    assert "make setup" in e.value.fix
    assert native.missing_features(avx512, ZEN5) == [] and native.missing_features("-DGGML_AMX_INT8=ON", ZEN5)
    # on this box, for real: a flag whose features it lacks, asked of `native build` (refused
    # before any compiling) and carried in a copied build's record (refused before loading)
    feats = native.cpu_features()
    lacking = next((f for f, need in native.NEEDS.items() if not set(need) <= feats), None)
    if lacking is None:
        pytest.skip("this CPU has every feature ggml's x86 flags need")
    flags = f"{native.PORTABLE_FLAGS} -D{lacking}=ON"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "src", "LABKIT_CACHE": str(tmp_path), "HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-S", "-B", "src/labkit/engines/native.py", "--flags", flags, "build"],
                       capture_output=True, text=True, env=env, cwd=Path(__file__).parents[1], timeout=60)
    assert p.returncode == 2 and f"-D{lacking}=ON" in p.stderr and "make setup" in p.stderr, p.stderr
    assert not list(tmp_path.glob("llama.cpp-*")), "nothing is built for a CPU that cannot run it"
    top = tmp_path / "llama.cpp-other-cpu"
    lib_dir = _copy_libs(native.find(verify=True), top / "build" / "bin")
    (top / "build.json").write_text(json.dumps({"cmake_args": flags, "patches": []}))
    p = _build_info_with(lib_dir)
    assert p.returncode != 0 and "this CPU lacks" in p.stderr and "make setup" in p.stderr, p.stderr[-2000:]
