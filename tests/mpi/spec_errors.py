"""How a strategy spec refuses a bad argument, at any number of ranks.

In a job of one rank the constructor raises its ``ValueError`` at once. In a job of
several it keeps it (:func:`hvdx.strategy_contract.validating`), and the entry point that takes
the spec raises it on every rank after the cross-rank check, so that a wrong value on
one rank only cannot end that rank alone.
"""

import re

import pytest


def refused(build, match):
    """The ``ValueError`` with which ``build()`` refuses its arguments (the message
    must match ``match``), raised or kept depending on the job's size."""
    try:
        spec = build()
    except ValueError as error:
        message = str(error)
    else:
        if spec.error is None:
            pytest.fail(f"{spec!r} was accepted")
        message = str(spec.error)
    assert re.search(match, message), f"{message!r} does not match {match!r}"
    return message
