"""The test suite: test modules import shared helpers from tests.helpers, never from each other."""
