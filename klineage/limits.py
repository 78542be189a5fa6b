"""Hardware limits and truncation lengths, named once.

The hardware figures are those of the GPUs klineage targets (sm_90: H100, H200) and of the
harness that calls a kernel. The truncation lengths say how much of a long text (a gate
message, an LLM answer, a code snippet) is kept where it is stored or shown: enough to act on,
short enough to keep lineages, cards and tables readable. Nothing here imports anything.
"""

from __future__ import annotations

# ---- hardware --------------------------------------------------------------------------------

DEFAULT_ARCH = "sm_90"
"""The architecture kernels are built for and skills are scoped to, unless told otherwise."""

HARNESS_ALIGNMENT = 256
"""Bytes every tensor the harness allocates is aligned to (torch's CUDA caching allocator)."""

# ---- texts kept in lineages, skills and reports ----------------------------------------------

GATE_MESSAGE_KEPT = 4000
"""Characters of the gate's message kept on a lineage edge, and of an LLM rejection's reason."""

LLM_ANSWER_KEPT = 2000
"""Characters of a rejected LLM answer kept in the lineage (the response cache has it all)."""

EXPERT_FAILURE_SHOWN = 2000
"""Characters of the failing workloads' messages quoted when an expert fails its own gate."""

RUN_MESSAGE_KEPT = 600
"""Characters of the gate's message kept in a replay run's record."""

PROBE_MESSAGE_KEPT = 500
"""Characters of a failing probe's message kept as a skill's evidence."""

RISK_MESSAGE_KEPT = 800
"""Characters of a rejected sibling's message kept as a skill's risk."""

ROUND_TRIP_REASON_KEPT = 400
"""Characters of the gate's reason kept in a skill's round-trip note."""

# ---- texts shown ----------------------------------------------------------------------------

EVENT_MESSAGE_SHOWN = 200
"""Characters of an LLM rejection shown in a walk's live progress event."""

CARD_RISK_SHOWN = 320
"""Characters of a risk's message shown on a skill's card."""

CARD_PROBE_SHOWN = 160
"""Characters of a failing probe's message shown on a skill's card."""

CARD_SNIPPET_SHOWN = 1600
"""Characters of a before/after code excerpt shown on a skill's card (cut at a whole line)."""

SOURCE_SNIPPET_SHOWN = 80
"""Characters of a node's source shown in a site, a refusal or an error message."""

PROMPT_SITE_SHOWN = 160
"""Characters of a detected site's first line shown to an LLM in a removal prompt."""

MISS_MESSAGE_SHOWN = 120
"""Characters of a rejected run's message quoted when explaining a replay miss."""
