"""One router per resource of API v1."""
