"""What plays next and with which seed: the shared (task, init state) sequence (``sequence``), sharding over
ranks (``scheduler``), and every random stream of a run derived from ``--seed`` (``seeding``)."""
