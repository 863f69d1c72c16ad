"""How the report words a comparison with the paper: a stated tolerance widened by the seed
spread, and never "agrees" from one seed."""

from balanceroute.analysis.report import AGREEMENT_RULE, _agreement, _ratio_words


def test_one_seed_is_indicative_never_agrees() -> None:
    # the quick report's case: +14.4 % against the paper's +11.9 % from one seed
    words = _agreement(14.4, 11.9, seeds=1)
    assert words.startswith("indicative, one seed: +2.5 points") and "agrees" not in words
    assert _ratio_words(0.76, 1.0, seeds=1) == "indicative, one seed: 0.76× the paper's factor"


def test_gain_agreement_band_is_tolerance_plus_two_sd() -> None:
    assert _agreement(13.0, 11.9, sd=0.0, seeds=3) == "agrees within ±1.5 points over 3 seeds"
    assert _agreement(14.4, 11.9, sd=0.2, seeds=3).startswith("differs: +2.5 points")
    assert _agreement(14.4, 11.9, sd=0.6, seeds=3) == "agrees within ±2.7 points over 3 seeds"
    assert _agreement(-1.0, 11.9, seeds=3) == "opposite sign"


def test_factor_agreement_band() -> None:
    assert _ratio_words(1.1, 1.0, seeds=2) == "agrees within ×1.15 over 2 seeds"
    assert _ratio_words(0.76, 1.0, seeds=5).startswith("differs: 0.76× the paper's factor")
    assert _ratio_words(0.76, 1.0, seeds=5, rel_sd=0.2).startswith("agrees within ×1.61")
    assert "1.5 percentage points" in AGREEMENT_RULE and "indicative" in AGREEMENT_RULE
