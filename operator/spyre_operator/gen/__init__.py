"""Generators of what is committed beside the code (no I/O of their own): the CRD from the API
models (:mod:`.crd`), docs/api.md from that CRD (:mod:`.apidoc`) and the reasons table of
docs/troubleshooting.md (:mod:`.reason_docs`). ``spyre-operator crd|api-doc|reasons-doc`` and
``make crds`` run them."""
