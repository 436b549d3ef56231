"""What tests share: helpers, never tests (no test module imports another)."""
