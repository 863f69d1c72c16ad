"""The pure-Python references, re-exported from the package (``balanceroute bench`` needs them
installed): ``reference_tick`` (the two-stage tick, literally) and ``naive_simulate`` (the model's dynamics with one
object per request). Tests and benchmark scripts import them from here."""

from balanceroute.analysis.reference import naive_simulate, reference_tick

__all__ = ["naive_simulate", "reference_tick"]
