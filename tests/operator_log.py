"""The operator's log read as records, not as text: which lines say the API server refused it.

A refusal is a 403 or a ``forbidden`` in a record's *message*; the timestamp is not searched
(``22:19:48,403`` is a time, and a run failed on it), nor the logger's name. Lines in the
operator's text format (``spyre_operator.cli.TEXT_FORMAT``) and its JSON format are parsed;
a line in neither (a traceback's continuation) is read whole.
"""

from __future__ import annotations

import json
import re

#: ``%(asctime)s %(levelname)s %(name)s: %(message)s``
_TEXT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.\-]+: (?P<message>.*)$")
#: An HTTP status 403 standing alone (not a digit run, a name or a number's part).
_REFUSED = re.compile(r"(?<![\w.,:\-])403(?![\w\-])|[Ff]orbidden|Not enough permissions"
                      r"|could not record event")
#: kopf probes for cluster-wide access it can live without (it falls back to the namespaces it
#: was given and to its startup discovery); everything else forbidden is an RBAC bug.
KOPF_OPTIONAL = re.compile(
    r"Not enough permissions to (list namespaces|watch for namespaces|watch for resources)"
    r'|cannot (list|watch) resource "(namespaces|customresourcedefinitions)"'
)


def message(line: str) -> str:
    """The message of one log line in either of the operator's formats (else the line)."""
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except ValueError:
            return line
        if isinstance(record, dict) and isinstance(record.get("message"), str):
            return record["message"] + "\n" + str(record.get("exception") or "")
        return line
    m = _TEXT.match(line)
    return m["message"] if m else line


def refusals(log: str) -> list[str]:
    """The lines whose message says the API server refused the operator something it needs."""
    out = []
    for line in log.splitlines():
        text = message(line)
        if _REFUSED.search(text) and not KOPF_OPTIONAL.search(text):
            out.append(line)
    return out
