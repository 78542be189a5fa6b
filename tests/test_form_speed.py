"""bench/form_speed.py: every pair of moves it times is written on the CPU, and its pairs are
the replay's own (the same state fingerprints), so its verdicts serve a replay chunk."""

from __future__ import annotations

import pytest

from klineage.problem import load_problem
from tests.bench_scripts import load_bench_script
from tests.conftest import REPO

speed = load_bench_script("form_speed")
CASES = [(name, folder) for name, form in speed.FORMS.items() for folder in form.problems]


@pytest.mark.parametrize(("form", "folder"), CASES)
def test_each_form_is_written_on_its_parent(form: str, folder: str) -> None:
    naive = load_problem(REPO / folder).kernel_source()
    parent, child = speed.pair(naive, speed.FORMS[form])
    assert len({naive.fingerprint, parent.fingerprint, child.fingerprint}) == 3


def test_the_cast_pair_is_the_one_the_replay_times_next() -> None:
    # settle at this commit: the skills method's next verdict on cast is 9611dae5 timed
    # against c3b34ceb (vectorized_access kept, then thread_coarsening on the vector kernel)
    naive = load_problem(REPO / "heldout" / "cast_f32_to_bf16").kernel_source()
    parent, child = speed.pair(naive, speed.FORMS["coarsen"])
    assert (parent.fingerprint[:8], child.fingerprint[:8]) == ("c3b34ceb", "9611dae5")
