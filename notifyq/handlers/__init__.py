"""notifyq's built-in job types."""
