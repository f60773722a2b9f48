"""Which llama.cpp build a CPU gets (AMX left out, llama.cpp issue #20824) and when weights may be repacked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pawfn.llamacpp import cpu
from tests.helpers.references import REPOSITORY

# Flag lines as /proc/cpuinfo prints them (trimmed to what matters, plus neighbours that must not confuse).
SAPPHIRE_RAPIDS = (
    "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi1 bmi2 avx2 avx512f avx512dq avx512ifma avx512cd avx512bw "
    "avx512vl avx_vnni avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg amx_bf16 avx512_fp16 amx_tile amx_int8"
)
EPYC_ZEN4 = (
    "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi1 bmi2 avx2 avx512f avx512dq avx512ifma avx512cd avx512bw "
    "avx512vl avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni"
)
EPYC_ZEN2 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi1 bmi2 avx2"


def _cpuinfo(tmp_path: Path, flags: str | None) -> Path:
    path = tmp_path / "cpuinfo"
    lines = ["processor\t: 0", "model name\t: a CPU"]
    if flags is None:  # aarch64 prints "Features", not "flags"
        lines.append("Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32")
    else:
        lines.append(f"flags\t\t: {flags}")
    path.write_text("\n".join(lines * 2) + "\n")  # two processors, as a real file has
    return path


def test_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    flags = cpu.cpu_flags(_cpuinfo(tmp_path, SAPPHIRE_RAPIDS))
    assert {"avx512f", "amx_int8", "amx_tile"} <= flags and cpu.cpu_has_amx(flags)
    assert not cpu.cpu_has_amx(cpu.cpu_flags(_cpuinfo(tmp_path, EPYC_ZEN4)))
    assert cpu.cpu_flags(_cpuinfo(tmp_path, None)) == frozenset()
    assert cpu.cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize("flags", [EPYC_ZEN4, EPYC_ZEN2, None], ids=["zen4", "zen2", "aarch64"])
def test_cpus_without_amx_keep_the_native_build(flags: str | None, tmp_path: Path) -> None:
    assert cpu.cmake_args_without_amx(cpu.cpu_flags(_cpuinfo(tmp_path, flags))) == []


def test_an_amx_cpu_gets_its_features_named_and_no_amx(tmp_path: Path) -> None:
    args = cpu.cmake_args_without_amx(cpu.cpu_flags(_cpuinfo(tmp_path, SAPPHIRE_RAPIDS)))
    assert args[0] == "-DGGML_NATIVE=OFF"
    on = {arg.removeprefix("-D").removesuffix("=ON") for arg in args if arg.endswith("=ON")}
    assert on == {
        "GGML_SSE42",
        "GGML_F16C",
        "GGML_FMA",
        "GGML_BMI2",
        "GGML_AVX",
        "GGML_AVX2",
        "GGML_AVX_VNNI",
        "GGML_AVX512",
        "GGML_AVX512_VBMI",
        "GGML_AVX512_VNNI",
        "GGML_AVX512_BF16",
    }
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(args)


def test_a_feature_is_named_only_when_the_cpu_has_all_it_compiles_with() -> None:
    """GGML_AVX512 compiles with -mavx512f/cd/vl/dq/bw: a CPU missing one must not get it (SIGILL)."""
    flags = set(SAPPHIRE_RAPIDS.split()) - {"avx512bw", "avx_vnni"}
    args = cpu.cmake_args_without_amx(flags)
    assert "-DGGML_AVX512=OFF" in args and "-DGGML_AVX_VNNI=OFF" in args and "-DGGML_AVX512_VNNI=ON" in args


def test_repacking_is_refused_only_where_cpu_and_build_both_have_amx() -> None:
    amx = frozenset(SAPPHIRE_RAPIDS.split())
    amx_build = "CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |"
    plain_build = "CPU : SSE3 = 1 | AVX512 = 1 | REPACK = 1 |"
    assert not cpu.repack_is_safe(amx, amx_build)
    assert cpu.repack_is_safe(amx, plain_build)
    assert cpu.repack_is_safe(frozenset(EPYC_ZEN4.split()), amx_build)


def test_cmake_args_print_from_the_file_alone(tmp_path: Path) -> None:
    """scripts/install.sh runs cpu.py by path before pawfn is installed: it must need the standard library only."""
    script = REPOSITORY / "src" / "pawfn" / "llamacpp" / "cpu.py"
    printed = subprocess.run(
        [sys.executable, "-I", str(script), "cmake-args", "--cpuinfo", str(_cpuinfo(tmp_path, SAPPHIRE_RAPIDS))],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert printed == cpu.cmake_args_without_amx(SAPPHIRE_RAPIDS.split())
    empty = subprocess.run(
        [sys.executable, "-I", str(script), "cmake-args", "--cpuinfo", str(_cpuinfo(tmp_path, EPYC_ZEN2))],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert empty.stdout.strip() == ""


def test_check_fails_for_a_build_that_would_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    amx_cpu = str(_cpuinfo(tmp_path, SAPPHIRE_RAPIDS))
    monkeypatch.setattr(cpu, "llama_cpp_system_info", lambda: "CPU : AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    assert cpu.main(["check", "--cpuinfo", amx_cpu]) == 1
    printed = capsys.readouterr()
    assert "AMX_INT8 = 1" in printed.out and cpu.AMX_ISSUE in printed.err and "cmake-args" in printed.err
    monkeypatch.setattr(cpu, "llama_cpp_system_info", lambda: "CPU : AVX512 = 1 | REPACK = 1 |")
    assert cpu.main(["check", "--cpuinfo", amx_cpu]) == 0
    monkeypatch.setattr(cpu, "llama_cpp_system_info", lambda: None)
    assert cpu.main(["check", "--cpuinfo", amx_cpu]) == 1
    assert "not installed" in capsys.readouterr().err
