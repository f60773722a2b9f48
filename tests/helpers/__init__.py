"""Helpers the tests import: tiny generated models and programs, reference runners, a local hub server."""
