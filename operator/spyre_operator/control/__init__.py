"""The parts of the controller (controller.py): its work queue, the caches' views, and the
groups of Controller methods (routing, observation, budgets, status, writes, claims), each a
mixin class that controller.Controller combines."""
