"""Reading ld's link failures: which library defines a missing symbol, and the message that
names every symbol and each flag once. (The real linker's output is in
test_compile_options_build.py; these are the lines it writes, for the cases a TMA kernel does
not reach: cuBLAS, a symbol of no known library, a library that is not installed.)"""

from __future__ import annotations

import pytest

from klineage.gate.link import library_for, link_failure


@pytest.mark.parametrize(
    ("symbol", "flag"),
    [
        ("cuTensorMapEncodeTiled", "-lcuda"),
        ("cuMemAlloc_v2", "-lcuda"),
        ("cublasSgemm_v2", "-lcublas"),
        ("cublasLtMatmul", "-lcublasLt"),
        ("curandCreateGenerator", "-lcurand"),
        ("ncclAllReduce", "-lnccl"),
        ("cudaMalloc", None),  # the runtime: nvcc links cudart itself
        ("cudnnCreate", "-lcudnn"),
        ("my_helper", None),
        ("cute_copy", None),  # 'cu' followed by lower case is not the driver API
    ],
)
def test_a_symbol_maps_to_the_library_that_defines_it(symbol: str, flag: str | None) -> None:
    found = library_for(symbol)
    assert (found[0] if found else None) == flag


LOG = """\
/usr/bin/ld: kernel.o: in function `run':
k.cudafe1.cpp:(.text+0x8b): undefined reference to `cublasSgemm_v2'
/usr/bin/ld: k.cudafe1.cpp:(.text+0x9b): undefined reference to `cublasCreate_v2'
/usr/bin/ld: k.cudafe1.cpp:(.text+0xab): undefined reference to `cuTensorMapEncodeTiled'
/usr/bin/ld: k.cudafe1.cpp:(.text+0xbb): undefined reference to `_Z6helperi'
collect2: error: ld returned 1 exit status
"""


def test_every_unresolved_symbol_is_named_and_each_flag_asked_for_once() -> None:
    failure = link_failure(LOG, "gemm.cu")
    assert failure is not None and failure.kind == "unresolved_symbol"
    lines = failure.message.splitlines()
    assert lines[0].startswith("gemm.cu: compiles, but calls 4 functions")
    assert "  cublasSgemm_v2: from cuBLAS, linked with -lcublas" in lines
    assert "  cuTensorMapEncodeTiled: from the CUDA driver API, linked with -lcuda" in lines
    assert any(line.startswith("  _Z6helperi (helper(int)): in no library") for line in lines)
    assert lines[-1].count('"-lcublas"') == 2 and lines[-1].count('"-lcuda"') == 2
    assert "compile_options.json" in lines[-1]


def test_a_library_the_machine_lacks_is_its_own_failure() -> None:
    log = "/usr/bin/ld: cannot find -lcuda: No such file or directory\ncollect2: error\n"
    failure = link_failure(log, "tma.cu")
    assert failure is not None and failure.kind == "library_not_found"
    assert "-lcuda" in failure.message and "lib64/stubs/libcuda.so" in failure.message
    older = link_failure("/usr/bin/ld: cannot find -l:libcuda.so.1\n", "tma.cu")
    assert older is not None and "-l:libcuda.so.1" in older.message


def test_a_log_without_link_trouble_is_none() -> None:
    assert link_failure('kernel.cu(3): error: identifier "y" is undefined\n', "k.cu") is None
