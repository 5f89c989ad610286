"""The env contract: registering envs and their options (``registry``), what the engine knows of observation
and action spaces (``spaces``), and what a multi-task env exposes (``multitask``)."""
