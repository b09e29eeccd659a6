"""What the running operator serves besides its reconciles: its Prometheus ``/metrics``
(:mod:`.metrics`) and who may read them (:mod:`.metrics_auth`), and the cold-start responder
scale-to-zero models fail over to (:mod:`.coldstart`)."""
