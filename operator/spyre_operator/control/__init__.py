"""The controller's collaborators (controller.py): the work queue, the caches' views, and one
class per job of a reconcile, each with its own state: Router (event_routing.py: which
models an event concerns), Observer (the observed state), Budgets (compile and rollout
slots), Writer (the writes of a decision), StatusReporter (failures, install conflicts, the
status last written), ClaimReleaser (claims left behind), GarbageCollector (the artifact GC of
the managed cache claims, gc.py; its pure decisions are decide/gc.py)."""
