"""walbridge schemas."""
