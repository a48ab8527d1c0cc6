"""Data sets: the files on disk checked on every route, the embedded digits and torchvision's sets,
corruptions and out-of-distribution inserts.
"""
