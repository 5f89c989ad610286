"""Evaluation: a checkpoint's policy on a fixed set of episodes, the tables and videos made from them."""
