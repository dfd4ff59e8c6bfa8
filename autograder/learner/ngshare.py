"""nbgrader's exchange over HTTP (ngshare), as the course's hub sets it up with `make hub EXCHANGE=ngshare`.

A server's ``nbgrader_config.py`` calls :func:`use_ngshare` with the address of the hub's ngshare
service; the course's own nbgrader_config.py does when ``COURSE_NGSHARE_URL`` is set (the hub sets it
in the instructor's server)::

    from autograder.learner.ngshare import use_ngshare
    use_ngshare(c, "http://127.0.0.1:8000/services/ngshare")

It installs ngshare-exchange's classes for every exchange step, with one change: ngshare-exchange
0.5.3's submit logs "Failed to submit." and still ends with success when ngshare refuses the
submission (a learner not on the course's roster, ngshare down), so the Assignments tab would show
it as submitted while nothing reached the instructor. Here such a submit fails, saying why.
"""

from __future__ import annotations

__all__ = ["use_ngshare"]


def use_ngshare(c, url: str) -> None:
    """Point nbgrader config ``c`` at the ngshare service at ``url`` (submit fails when ngshare refuses it)."""
    import ngshare_exchange
    from ngshare_exchange import ExchangeSubmit

    class CheckedSubmit(ExchangeSubmit):
        """ngshare-exchange's submit, failing when ngshare did not store the submission."""

        def copy_files(self):
            self.timestamp = None
            super().copy_files()
            if self.timestamp is None:
                self.fail(f"ngshare did not take the submission of {self.coursedir.assignment_id} (its answer is in "
                          f"the lines above): it is NOT submitted. 'Permission denied' means you are not on the "
                          f"course {self.coursedir.course_id!r} in ngshare yet: log in to the hub again in a "
                          "minute, or ask your instructor.")

    ngshare_exchange.configureExchange(c, url)
    c.Exchange.pop("root", None)  # the shared folder's setting: ngshare's classes have none, and would warn
    c.ExchangeFactory.submit = CheckedSubmit
