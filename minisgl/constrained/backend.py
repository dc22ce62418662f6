"""The one place xgrammar is imported: on first use, since importing it takes seconds and most
engines never see a grammar."""

from __future__ import annotations

import functools
import re
from types import ModuleType

# xgrammar's C++ errors start with a timestamp and a source location, and checks with their condition.
_NOISE = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


@functools.cache
def xgrammar() -> ModuleType:
    import xgrammar as xgr

    return xgr


def error_message(error: BaseException) -> str:
    """xgrammar's message without its C++ location prefix, on one line."""
    lines = [_NOISE.sub("", line).strip() for line in str(error).strip().splitlines()]
    return " ".join(line for line in lines if line)
