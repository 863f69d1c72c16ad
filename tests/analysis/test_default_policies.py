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


def test_every_experiment_row_is_a_catalogue_name():
    from balanceroute.analysis.experiments import SCALING_POLICIES, TABLE1_POLICIES
    from balanceroute.analysis.quality import QUALITY_POLICIES
    from balanceroute.core.policies import BASELINES

    for names in (TABLE1_POLICIES, SCALING_POLICIES, QUALITY_POLICIES, BASELINES):
        assert set(names) <= set(catalogue.CATALOGUE), names
    assert set(BASELINES) <= set(catalogue.default_names())


def test_the_proxy_runs_only_rows_without_a_workload():
    import pytest

    online = {n for n, e in catalogue.CATALOGUE.items() if e.online}
    assert online == {"random", "round_robin", "power_of_two", "jsq", "least_load", "bfio-h0",
                      "bfio-h0-lease", "bfio", "br0", "brh", "brh-survival"}
    with pytest.raises(ValueError, match="unknown policy 'brh-oracle'; valid: random"):
        catalogue.build_policy("brh-oracle", online=True)
    assert catalogue.build_policy("bfio", online=True).predictor is None  # no training data online
    with pytest.raises(ValueError, match="training workload"):
        catalogue.build_policy("bfio")
