"""The split_k mechanism: the host's choice of K splits deleted, so one block owns K."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.mechanisms.roundtrip import RoundTripSuite, removal_chain
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("split_k")


class TestSplitK(RoundTripSuite):
    mechanism = "split_k"

    def test_forward_restores_before(self) -> None:
        """Apply is refused with a reason: splitting K needs a workspace and a reduction."""
        for pair in self.pairs():
            after = removal_chain(self.subject, pair.before).states[-1]
            for candidate in self.subject.candidates(after):
                with pytest.raises(MechanismRefused, match="reduction kernel"):
                    self.subject.apply(after, candidate)


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
    source = KernelSource(
        'extern "C" int run(long n) {\n  int splits = 2;\n'
        "  if (n < 64) splits = 4;\n  return splits;\n}\n"
    )
    (site,) = mechanism.detect(source)
    assert "initialized to 1" in (site.refusal or "")
