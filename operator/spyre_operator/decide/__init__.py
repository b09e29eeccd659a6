"""The reconcile decisions, one module per concern (pure, no I/O).

:mod:`.observed` holds what they all read and return (``Observed``, ``Policy``,
``Decision``) and shared helpers; then the cache claim (:mod:`.cache`), the artifact on it
(:mod:`.artifact`), status.cache (:mod:`.cache_status`), what the Deployment serves
(:mod:`.serving`), the Gateway routing through an InferencePool (:mod:`.inference_pool`),
scale to zero (:mod:`.scaletozero`), garbage collection (:mod:`.gc`) and the conditions
(:mod:`.status`); :mod:`.assemble` puts them together in ``decide()``. Importers
use :mod:`spyre_operator.reconcile`, which re-exports them.
"""
