"""What runs inside a worker process."""
