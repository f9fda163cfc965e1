"""onnxruntime's error messages as a user reads them: without the C++ source location."""

from __future__ import annotations

import re

# Where in onnxruntime's C++ sources an error was raised, and the signature of the function
# ("/onnxruntime_src/…/model_load_utils.h:46 void onnxruntime::…::ValidateOpsetForDomain(…)"):
# noise to a user, before the sentence that says what is wrong.
_SOURCE_LOCATION = re.compile(
    r"\S*onnxruntime_src/\S+:\d+ (?:[^()\n]*?\((?:[^()]|\([^()]*\))*\)(?: const)?(?=\s|$))?\s*")


def without_source_location(text: str) -> str:
    """`text` without the source locations and function signatures onnxruntime puts in it."""
    return _SOURCE_LOCATION.sub("", text)
