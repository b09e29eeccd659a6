"""tests/operator_log.py: refusals are found in messages, never in timestamps or names."""

from __future__ import annotations

import json

from tests.operator_log import refusals

#: The line a CI run failed on: its time's milliseconds were 403.
TIMED_403 = ("2026-12-06 22:19:48,403 INFO spyre_operator.kube.apply: Updated Deployment "
             "t-test-chart-operator-pod-reconciles-a-rea-0df7df/tiny")


def test_a_timestamp_or_a_name_holding_403_is_not_a_refusal() -> None:
    log = "\n".join([
        TIMED_403,
        "2026-12-06 22:19:48,001 INFO spyre_operator.kube.apply: Updated Service ns-4031/x",
        "2026-12-06 22:19:48,001 INFO spyre_operator.kube.apply: Updated Service n/t-403abc",
        "2026-12-06 22:19:48,001 INFO spyre_operator.kube.apply: took 0.403 s",
        json.dumps({"time": "2026-12-06T22:19:48.403Z", "level": "INFO",
                    "logger": "spyre_operator.kube.apply", "message": "Updated Job n/x"}),
    ])
    assert refusals(log) == []


def test_refusals_in_either_format_are_found() -> None:
    text = ('2026-12-06 22:19:48,100 ERROR spyre_operator.kube.apply: patch Deployment n/x: '
            'deployments.apps "x" is forbidden: User "system:serviceaccount:o:op" cannot patch')
    status = "2026-12-06 22:19:48,100 WARNING kopf.objects: API error (403): no"
    js = json.dumps({"time": "2026-12-06T22:19:48.100Z", "level": "ERROR", "logger": "kopf",
                     "message": "Request failed with status 403"})
    event = "2026-12-06 22:19:48,100 WARNING spyre_operator.events: could not record event x"
    noise = "2026-12-06 22:19:48,100 INFO kopf: Not enough permissions to list namespaces."
    assert refusals("\n".join([text, status, js, event, noise])) == [text, status, js, event]
