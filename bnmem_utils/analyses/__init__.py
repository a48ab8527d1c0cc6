"""Analyses behind the notebooks: the theory checks, memorization summaries, leakage tables, the
matched-gap and confound studies, the mitigation study, and the claims with their one judge.
"""
