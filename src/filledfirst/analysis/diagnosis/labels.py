"""What filled first: the labels the diagnosis gives a run. String-valued, so the stored
`diagnosis.label` and every comparison with a label read from the database are the text."""

from __future__ import annotations

from enum import StrEnum


class Label(StrEnum):
    FAILED = "failed"
    INTERFERENCE = "prefill-decode interference"
    KV_PRESSURE = "KV-capacity pressure"
    PREFIX_EVICTION = "prefix-cache eviction"
    SEQ_LIMIT = "active-sequence limit"
    TOKEN_BUDGET = "prefill token budget"
    COMPUTE = "compute-bound"
    REFERENCE = "reference"
    UNCLASSIFIED = "unclassified"
