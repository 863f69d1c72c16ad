"""Default compare rows and the optional extras they need."""

import importlib.util

from balanceroute import catalogue


def test_default_rows_are_the_papers_table1_and_bfio_when_every_extra_is_installed(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert catalogue.default_names() == [
        "random", "round_robin", "power_of_two", "jsq", "least_load", "bfio-h0", "bfio",
        "br0", "brh-survival", "brh-exact", "brh-learned", "brh-oracle",
    ]


def test_rows_whose_extra_is_missing_are_left_out_and_named(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "torch" else real(name))
    assert "brh-learned" not in catalogue.default_names()
    assert catalogue.missing_extras() == {"brh-learned": "learned"}
    assert "brh-learned" in catalogue.CATALOGUE  # still accepted when asked for
