"""Running the notebooks: the notebook context, parameters and profiles, the headless runner, its
summaries, the HTML and LaTeX export, and the ``bnmem`` command line.
"""
