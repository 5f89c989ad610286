"""What the off-policy algorithms share: the replay with its n-step targets (``replay``), and the critic ensemble
with its subset-min target and Polyak averaging (``critics``)."""
