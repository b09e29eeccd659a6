"""Pure desired-state builders: a SpyreModel spec in, typed Kubernetes objects out, no I/O."""
