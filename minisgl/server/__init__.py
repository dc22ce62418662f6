"""The HTTP server (front end + scheduler process) and the interactive chat shell."""
