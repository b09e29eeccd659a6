"""Shared pieces of the SpyreModel API: patterns and limits, the base model (camelCase,
no unknown fields), CEL rules, tasks and backends."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

# The engine's own names for them (engine/spyre_contract: one spelling for both sides).
from spyre_contract import POOLING_TASKS as POOLING_TASKS
from spyre_contract import Backend as Backend
from spyre_contract import Task as Task

#: Regular expression for a Kubernetes resource quantity (as in apimachinery).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
#: domain/name of an extended resource (e.g. ibm.com/spyre_vf); the domain has a dot.
EXTENDED_RESOURCE_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
MODEL_URI_PATTERN = (
    r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+(@[A-Za-z0-9._/-]+)?"
    r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/[^@]*)$"
)

#: A positive quantity: no sign but "+", and a non-zero digit before any suffix or exponent
#: (with QUANTITY_PATTERN: "0", "0.0", "-1Gi" and "0e3" are not).
POSITIVE_QUANTITY_PATTERN = "^[+]?0*[.]?0*[1-9]"
#: The most characters of a name that becomes a label value (a cache claim's, on its PVC, Jobs
#: and pods: serving.spyre.dev/cache-claim).
MAX_LABEL_VALUE = 63
#: The most characters of a SpyreModel's name: its Events are named ``<name>.<16 hex>`` and an
#: object name has at most 253 (desired/names.py, event_name).
MAX_MODEL_NAME = 253 - 17
#: A DNS subdomain (RFC 1123), like every PVC name.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: A label value (with at most 63 characters), as the API server checks a pod's nodeSelector.
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
#: A label or annotation key: an optional DNS-subdomain prefix and "/", then a name of at most
#: 63 characters (no backslash: the same text is a CEL string).
QUALIFIED_NAME = (
    "([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def keys_are_qualified_names(what: str) -> dict[str, Any]:
    """A map whose keys become label or annotation keys of a pod (else every write of the pod
    template is refused)."""
    return {
        "x-kubernetes-validations": [
            cel(
                f"self.all(k, k.matches('^{QUALIFIED_NAME}$'))",
                f"{what} keys must be label keys: an optional DNS-name prefix and '/', then at "
                "most 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
                "or digit",
            )
        ]
    }


#: Node labels a pod must match: label keys and label values (at most 63 characters).
NodeSelector = dict[
    str, Annotated[str, Field(max_length=MAX_LABEL_VALUE, pattern=LABEL_VALUE_PATTERN)]
]

Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "maxLength": 64,
            "x-kubernetes-int-or-string": True,
            # A negative or zero size or resource would pass the pattern; the PVC or pod built
            # from it would then be refused on every write.
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == int ? self > 0 : "
                    f"self.matches('{POSITIVE_QUANTITY_PATTERN}')",
                    "message": "must be a positive quantity (more than 0), e.g. 50Gi, 2 or 500m",
                }
            ],
        }
    ),
]
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


def cel(rule: str, message: str, **extra: str) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry."""
    return {"rule": rule, "message": message, **extra}


class ApiModel(BaseModel):
    """Base for API objects: camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_enum_values=True,
    )


