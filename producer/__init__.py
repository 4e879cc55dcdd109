"""walbridge producer."""
