"""The exact-match key of a request text: case, spacing and trailing
punctuation do not matter ("  What is  HTTP? " == "what is http")."""

from __future__ import annotations

import re
import unicodedata

_SPACE = re.compile(r"\s+")
_EDGE = re.compile(r"^[\s\W_]+|[\s?!.,;:]+$")


def normalize(text: str) -> str:
    """NFKC, lower case, runs of white space as one space, no leading or trailing
    punctuation."""
    text = unicodedata.normalize("NFKC", text).lower()
    return _EDGE.sub("", _SPACE.sub(" ", text)).strip()
