"""The control floor: the controller (controller.py: level-based reconciles over a
de-duplicating work queue) and what it needs beside the watches: the re-lists that drop ghosts
(resync.py), leader election (leader.py), the other installs' stamps (peers.py) and the watches
of optional APIs (optional.py).

The controller's collaborators: the work queue, the caches' views, and one class per job of a
reconcile, each with its own state: Router (event_routing.py: which models an event concerns),
Observer (the observed state), Budgets (compile and rollout slots), Writer (the writes of a
decision), StatusReporter (failures, install conflicts, the status last written),
ClaimReleaser (claims left behind), GarbageCollector (the artifact GC of the managed cache
claims, gc.py; its pure decisions are decide/gc.py)."""
