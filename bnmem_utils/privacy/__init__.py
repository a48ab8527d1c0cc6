"""Membership-inference attacks over a bank's keep matrix and scores: LiRA, RMIA, threshold
baselines, ROC metrics (plain NumPy).
"""
