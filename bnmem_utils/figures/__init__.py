"""Figures (one style, one save helper) and the notebooks' interactive explorers.
"""
