"""BalanceRoute: barrier-aware routing of prefilled requests to data-parallel decode replicas.

Subpackages: :mod:`balanceroute.core` (model, policies, simulator, workloads),
:mod:`balanceroute.solvers` (exact oracles), :mod:`balanceroute.serving` (proxy, emulator),
:mod:`balanceroute.analysis` (experiments).
"""

__version__ = "0.1.0"
