"""The base layer: paths, input checks, the thread and allocator policy, intervals, the one cache,
devices, results records, staged outputs and the executors that run callables locally or on Ray.
"""
