"""Run-time subclasses of the user's optimizer class, as Horovod builds them."""

from __future__ import annotations

__all__ = ["subclass_of"]


def subclass_of(optimizer, methods: type) -> type:
    """A class named like ``optimizer``'s, deriving from it, with ``methods``' members
    (those of the classes ``methods`` derives from too, its own winning).

    ``isinstance(instance, type(optimizer))`` then holds. The base class is stored as
    ``_hvdx_base`` and called explicitly, never found through
    ``super(self.__class__, self)``, so subclassing the result does not recurse.
    """
    base = optimizer.__class__
    namespace = {}
    for klass in reversed(methods.__mro__[:-1]):  # a shared part first, then its deriver's
        namespace.update(klass.__dict__)
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    namespace["_hvdx_base"] = base
    return type(base.__name__, (base,), namespace)
