"""The course as a website: ``make site`` (``python -m autograder site``) builds ``dist/site/``.

- :mod:`.execute` runs the instructor notebooks once per content and keeps the results
  (the test suite's notebook runs fill the same cache).
- :mod:`.pages` makes each lesson's page from the learner notebook, with the outputs of the
  instructor run only where they give nothing away.
- :mod:`.build` writes the Sphinx project (MyST-NB, sphinx-book-theme) and builds it.
"""
