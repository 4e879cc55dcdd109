"""Test helpers shared by the test suites (no tests in here)."""
