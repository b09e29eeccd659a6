"""The API server's writer: :mod:`.apply` writes every child and the status of a SpyreModel
(server-side apply, deletes, Events; the leader's Lease and the metrics reviews aside), and
:mod:`.podsecurity` is the start-up probe of whether the platform assigns pods their user."""
