"""Serving on top of the engine: the HTTP server and the router."""
