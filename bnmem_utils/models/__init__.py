"""Architectures and norms (one registry), and the gamma/sigma statistics of BatchNorm layers.
"""
