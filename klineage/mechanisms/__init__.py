"""The mechanism catalog: optimizations that can be removed from and applied to kernels.

The protocol, sites, carriers and the registry live in :mod:`klineage.mechanisms.base`; each
mechanism is one module here, found automatically (see ``_load_builtin``)::

    from klineage.mechanisms import get, detect_all
    sites = get("fast_math").detect(kernel)
    simpler = get("fast_math").remove(kernel, sites[0])
"""

from klineage.mechanisms.base import (
    CATEGORIES,
    Carrier,
    Category,
    Mechanism,
    MechanismError,
    MechanismRefused,
    Refusal,
    Site,
    UnknownMechanism,
    all_mechanisms,
    detect_all,
    get,
    mechanism_names,
    register,
    remove_all,
    remove_first,
)
from klineage.mechanisms.recall import RecallReport, detection_recall

__all__ = [
    "CATEGORIES",
    "Carrier",
    "Category",
    "Mechanism",
    "MechanismError",
    "MechanismRefused",
    "RecallReport",
    "Refusal",
    "Site",
    "UnknownMechanism",
    "all_mechanisms",
    "detect_all",
    "detection_recall",
    "get",
    "mechanism_names",
    "register",
    "remove_all",
    "remove_first",
]
