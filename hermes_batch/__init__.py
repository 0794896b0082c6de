"""hermes-batch: run prompts through a tool-using LLM agent in sandboxes and write training trajectories."""

__version__ = "0.1.0"
