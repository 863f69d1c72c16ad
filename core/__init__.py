"""Pure math and online decisions: the barrier model, policies, predictors, the simulator and
workloads. numpy (and numba for hot loops); no I/O beyond reading trace files, no global RNG."""

from .model import discounts, envelope, f_score, horizon_f_score, imbalance, margins
from .state import Assignment, ClusterState, PoolView

__all__ = [
    "Assignment",
    "ClusterState",
    "PoolView",
    "discounts",
    "envelope",
    "f_score",
    "horizon_f_score",
    "imbalance",
    "margins",
]
