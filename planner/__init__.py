"""planner: symbolic/constraint planning for distributed deep-learning training."""
