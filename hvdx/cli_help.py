"""One convention for ``--help`` across ``hvdx`` and its subcommands: every option's
default, once, written ``(default: X)``.

:class:`DefaultsHelpFormatter` appends ``(default: X)`` to an option whose default is a
value. An option whose default is ``None`` means something the parser cannot print
("from --preset", "all", "none"), so its help says ``(default: ...)`` itself and the
formatter leaves it alone. Flags (``store_true``) are off unless given, as everywhere,
and get nothing.
"""

from __future__ import annotations

import argparse

__all__ = ["DefaultsHelpFormatter"]

#: What an option's help must contain for the formatter to leave it alone.
MARK = "(default"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """:class:`argparse.HelpFormatter` that shows each option's default once (see module)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        # Positionals, help/version actions (SUPPRESS), flags (False) and None-defaults
        # (which say their default in words) get nothing added.
        if (not action.option_strings or MARK in text or default is None
                or default is False or default is argparse.SUPPRESS
                or isinstance(action, argparse._StoreConstAction)):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"

