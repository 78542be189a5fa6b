"""compile_options.json in a problem folder: read with the problem, and refused with the file,
the line and the fix when a key is unknown or a flag would break what the harness loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from klineage.problem import (
    COMPILE_OPTIONS_FILE,
    CompileOptions,
    ProblemError,
    dump_compile_options,
    load_compile_options,
    load_problem,
)
from tests.conftest import FIXTURES

TMA = FIXTURES / "problems" / "tma_copy"
PLAIN = FIXTURES / "problems" / "scale_rows"


def _folder_with(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "p"
    shutil.copytree(PLAIN, folder)
    (folder / COMPILE_OPTIONS_FILE).write_text(text)
    return folder


def test_the_tma_fixture_links_the_driver_api() -> None:
    problem = load_problem(TMA)
    assert problem.compile_options.ld_flags == ("-lcuda",)
    assert not problem.compile_options.empty


def test_a_folder_without_the_file_has_no_extra_flags() -> None:
    assert load_problem(PLAIN).compile_options.empty


def test_every_list_is_read(tmp_path: Path) -> None:
    text = (
        '{"cflags": ["-DNDEBUG"], "cuda_cflags": ["-DTILE=128", "-Xptxas=-O3"],\n'
        ' "ld_flags": ["-lcublas", "-L/opt/lib", "-Wl,--as-needed", "-l:libcuda.so.1"]}\n'
    )
    options = load_problem(_folder_with(tmp_path, text)).compile_options
    assert options.cflags == ("-DNDEBUG",)
    assert options.cuda_cflags == ("-DTILE=128", "-Xptxas=-O3")
    assert options.ld_flags == ("-lcublas", "-L/opt/lib", "-Wl,--as-needed", "-l:libcuda.so.1")


def test_written_options_read_back_the_same(tmp_path: Path) -> None:
    options = CompileOptions(cuda_cflags=("--use_fast_math",), ld_flags=("-lcuda",))
    path = dump_compile_options(options, tmp_path)
    assert path == tmp_path / COMPILE_OPTIONS_FILE
    assert load_compile_options(tmp_path) == options
    assert dump_compile_options(CompileOptions(), tmp_path / "none") is None


# (file text, the line the error names, the field, a phrase of the message)
BAD = [
    ('{\n  "ld_flags": ["-lcuda"],\n  "ldflags": ["-lcublas"]\n}\n', 3, "ldflags", "unknown key"),
    ('{\n  "ld_flags": ["-lcuda -lcublas"]\n}\n', 2, "ld_flags[0]", "whitespace"),
    ('{\n  "ld_flags": ["cuda"]\n}\n', 2, "ld_flags[0]", "not a flag"),
    ('{\n  "ld_flags": ["-pthread"]\n}\n', 2, "ld_flags[0]", "not a linker flag"),
    ('{\n  "ld_flags": ["-Wl,-z,undefs"]\n}\n', 2, "ld_flags[0]", "unresolved symbol"),
    ('{\n  "ld_flags": ["-Llib"]\n}\n', 2, "ld_flags[0]", "relative folder"),
    ('{\n  "cuda_cflags": ["-arch=sm_80"]\n}\n', 2, "cuda_cflags[0]", "chooses the target"),
    ('{\n  "cuda_cflags": ["-DX", "-rdc=true"]\n}\n', 2, "cuda_cflags[1]", "device link"),
    ('{\n  "cuda_cflags": ["-o", "out.so"]\n}\n', 2, "cuda_cflags[0]", "names the output"),
    ('{\n  "cuda_cflags": ["-MD"]\n}\n', 2, "cuda_cflags[0]", "dependency output"),
    ('{\n  "cuda_cflags": ["-Xptxas", "-v"]\n}\n', 2, "cuda_cflags[0]", "no value"),
    ('{\n  "cuda_cflags": ["-Xcompiler=-O2"]\n}\n', 2, "cuda_cflags[0]", "go in cflags"),
    ('{\n  "cflags": ["-fvisibility=hidden"]\n}\n', 2, "cflags[0]", "visible symbol"),
    ('{\n  "cflags": ["-Wl,-lcuda"]\n}\n', 2, "cflags[0]", "comma"),
    ('{\n  "cflags": "-O2"\n}\n', 2, "cflags", "invalid value"),
]


@pytest.mark.parametrize(("text", "line", "field", "phrase"), BAD)
def test_a_bad_file_names_the_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str, phrase: str
) -> None:
    folder = _folder_with(tmp_path, text)
    with pytest.raises(ProblemError) as caught:
        load_problem(folder)
    err = caught.value
    assert err.file.name == COMPILE_OPTIONS_FILE
    assert (err.line, err.field) == (line, field)
    assert phrase in str(err)
    assert err.expected  # every refusal says what to write instead


def test_a_file_that_is_not_an_object_says_what_it_should_be(tmp_path: Path) -> None:
    with pytest.raises(ProblemError, match=r'compile_options.json:1: .*"ld_flags"'):
        load_problem(_folder_with(tmp_path, '["-lcuda"]\n'))
    with pytest.raises(ProblemError, match=r"compile_options.json:2: invalid JSON"):
        load_problem(_folder_with(tmp_path / "b", '{\n  "ld_flags": [-lcuda]\n}\n'))
