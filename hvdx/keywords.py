"""A misspelt keyword argument of an hvdx constructor, named with the closest one it takes.

``hvd.Compression.topk(ration=0.1)``, ``hvdx.DSSync(group_sise=2)`` and
``hvdx.Decentralized(topolgy="ring")`` would otherwise fail with Python's bare
``got an unexpected keyword argument``; the same values in ``HVDX_COMPRESSION`` and
``HVDX_SYNC`` go through :func:`bind` too. The error stays a ``TypeError``, as Python's
own, raised without a chain::

    topk() got an unexpected keyword argument 'ration'; did you mean 'ratio'?
"""

from __future__ import annotations

import difflib
import inspect
from typing import List, Mapping, Optional, Sequence

__all__ = ["bind", "check_keywords", "unexpected_keyword"]

_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unexpected_keyword(function: str, signature: inspect.Signature,
                       kwargs: Mapping[str, object]) -> Optional[TypeError]:
    """The ``TypeError`` for the first of ``kwargs`` that ``signature`` does not take
    (``None`` if it takes them all, or takes ``**kwargs``), naming ``function``, the
    keyword, and the closest keyword it takes (``difflib``), else all of them."""
    parameters = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    accepted = [p.name for p in parameters if p.kind in _BY_NAME and p.name != "self"]
    for keyword in kwargs:
        if keyword not in accepted:
            return TypeError(f"{function}() got an unexpected keyword argument "
                             f"{keyword!r}; {_hint(keyword, accepted)}")
    return None


def check_keywords(function: str, signature: inspect.Signature,
                   kwargs: Mapping[str, object]) -> None:
    """Raise :func:`unexpected_keyword`'s error, if any."""
    error = unexpected_keyword(function, signature, kwargs)
    if error is not None:
        raise error


def bind(function: str, signature: inspect.Signature, args: Sequence,
         kwargs: Mapping[str, object]) -> inspect.BoundArguments:
    """``signature.bind(*args, **kwargs)``; a ``TypeError`` names ``function`` (and, for
    an unknown keyword, the closest it takes), without a chain."""
    check_keywords(function, signature, kwargs)
    try:
        return signature.bind(*args, **kwargs)
    except TypeError as error:
        problem = str(error)
        raise TypeError(f"{function}() {problem}" if problem.startswith("got ")
                        else f"{function}(): {problem}") from None


def _hint(keyword: str, accepted: List[str]) -> str:
    close = difflib.get_close_matches(keyword, accepted, n=1)
    if close:
        return f"did you mean {close[0]!r}?"
    return "it takes " + ", ".join(accepted)
