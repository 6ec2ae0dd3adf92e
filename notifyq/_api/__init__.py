"""The admin API: the ASGI application and the job routes."""
