"""Termination predictors for BR-H: (features, ages, H) -> (p_fin, mu_rem)."""
