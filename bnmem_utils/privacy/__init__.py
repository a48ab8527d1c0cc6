"""Membership-inference attacks over a bank's keep matrix and scores: LiRA (with the rule that
picks the headline variant and a small-sample variant), RMIA, threshold baselines, ROC metrics,
and attack quality against the number of shadows (plain NumPy).
"""
