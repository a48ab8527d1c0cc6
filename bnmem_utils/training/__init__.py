"""Training: one sequential loop and a vectorised path that trains K models at once behind the same
interface, the step helpers, the gamma/sigma penalty and per-sample gradients.
"""
