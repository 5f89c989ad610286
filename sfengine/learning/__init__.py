"""learning."""
