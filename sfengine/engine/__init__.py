"""The engine's machinery: the runner and its wiring (``wiring.connect_components``, the one place the data flow
is wired), supervision of the worker processes (death, respawn, hangs), the event loops and their messages,
the shared-memory buffers, the worker layout (``sizing``), checkpoints and torchrun (``distributed``)."""
