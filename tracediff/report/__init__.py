"""Renderers: terminal (rich) and JSON, from the plain dicts that diff/ and summary produce."""
