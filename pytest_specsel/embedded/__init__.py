"""The embedded CPU default's assets: the bundled target model and the toy proposers with their
training. May import: ``core`` at most; never ``run`` nor the pytest glue.
"""
