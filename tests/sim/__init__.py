"""Tests of the rollout simulator (affinity_sim)."""
