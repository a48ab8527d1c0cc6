"""Jobs built from one run description (:class:`~bnmem_utils.jobs.config.RunConfig`): grids of
training runs, shadow-model banks and their members, gradient-norm tracking; each cached under
its key.
"""
