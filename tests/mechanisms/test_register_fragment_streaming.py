"""register_fragment_streaming: detected where MMA operands come straight from global memory;
removal and application refused (a re-tiling)."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.conftest import REPO
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs

mechanism = get("register_fragment_streaming")


class TestRegisterFragmentStreaming(RoundTripSuite):
    mechanism = "register_fragment_streaming"

    def test_forward_restores_before(self) -> None:
        """Nothing is removed, and there is nowhere to apply it: both refused."""
        for pair in self.pairs():
            assert pair.before.text == pair.after.text
            (site,) = self.subject.detect(pair.before)
            with pytest.raises(MechanismRefused, match="re-tiles"):
                self.subject.remove(pair.before, site)
            assert self.subject.candidates(pair.before) == []


def test_the_gemm_expert_small_m_path_is_detected() -> None:
    kernel = KernelSource.from_file(REPO / "expert_kernels" / "gemm_bf16" / "kernel.cu")
    (site,) = mechanism.detect(kernel)
    assert site.function == "gemm_skinny" and not site.supported


def test_a_staged_kernel_is_not_streaming() -> None:
    text = fixture_pairs("register_fragment_streaming")[0].before.text
    staged = text.replace(
        "const int lane =", 'asm volatile("cp.async.wait_all;\\n");\n  const int lane ='
    )
    assert mechanism.detect(KernelSource(staged)) == []
