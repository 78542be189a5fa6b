"""The split_k mechanism: the host's choice of K splits deleted, so one block owns K; the
carried choice put back where the split path is still there."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from klineage.mining.removal import reapply, remove_each_site, remove_mechanism
from tests.mechanisms.roundtrip import RoundTripSuite, removal_chain
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("split_k")


class TestSplitK(RoundTripSuite):
    mechanism = "split_k"

    def test_a_new_split_is_refused(self) -> None:
        """Without a carried choice apply is refused: a new split needs a workspace, a
        reduction and a heuristic."""
        for pair in self.pairs():
            simplified = removal_chain(self.subject, pair.before).states[-1]
            candidates = self.subject.candidates(simplified)
            assert candidates
            for candidate in candidates:
                with pytest.raises(MechanismRefused, match="reduction kernel"):
                    self.subject.apply(simplified, candidate)


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("split_k") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "split_k")


def test_kernel_sites_point_at_the_host_choice() -> None:
    from tests.conftest import REPO

    kernel = KernelSource.from_file(REPO / "expert_kernels" / "gemm_bf16" / "kernel.cu")
    sites = mechanism.detect(kernel)
    host = [s for s in sites if s.detail["side"] == "host"]
    assert len(host) == 2 and all(s.supported for s in host)
    kernels = [s for s in sites if s.detail["side"] == "kernel"]
    assert kernels and all("host-side choice" in (s.refusal or "") for s in kernels)


def test_a_choice_that_does_more_is_refused() -> None:
    source = KernelSource(  # the count is a split count by being the grid's y extent
        "__global__ void part(int n) {}\n"
        'extern "C" int run(long n) {\n  int splits = 2;\n'
        "  if (n < 64) splits = 4;\n  part<<<dim3(1, splits), 32>>>(n);\n  return splits;\n}\n"
    )
    (site,) = mechanism.detect(source)
    assert "initialized to 1" in (site.refusal or "")


def _gemm() -> KernelSource:
    from tests.conftest import REPO

    return KernelSource.from_file(REPO / "expert_kernels" / "gemm_bf16" / "kernel.cu")


def test_each_of_the_gemm_choices_goes_back_alone_where_it_was() -> None:
    """Two `int splits = 1;` blocks (skinny and tiled): the candidate is the one whose choice
    is gone, and its carried choice restores the expert."""
    kernel = _gemm()
    assert [c for c in mechanism.candidates(kernel) if c.supported] == []
    whole = remove_mechanism(kernel, mechanism)
    assert reapply(whole).text == kernel.text
    for single in remove_each_site(kernel, whole):
        (candidate,) = [c for c in mechanism.candidates(single.simplified) if c.supported]
        assert candidate.detail == {"side": "host", "split": "splits"}
        assert reapply(single).text == kernel.text


def test_a_carried_choice_that_assigns_something_else_is_refused() -> None:
    kernel = _gemm()
    whole = remove_mechanism(kernel, mechanism)
    candidate = next(c for c in mechanism.candidates(whole.simplified) if c.supported)
    for choice in ("if (tiles < sms) tiles = 2;", "if (tiles < sms) splits = 2; else splits = 3;"):
        with pytest.raises(MechanismRefused, match="carried choice"):
            mechanism.apply(whole.simplified, candidate, Carrier(choice=choice))


def test_a_count_nothing_reads_is_no_candidate() -> None:
    source = KernelSource('extern "C" int run(long n) {\n  int splits = 1;\n  return 0;\n}\n')
    assert [c for c in mechanism.candidates(source) if c.supported] == []
