"""`verl-hyperlight serve`: Sandbox Fusion's HTTP API over the case path, on pure ASGI alone:
the application and its uvicorn (``app``), the pure-ASGI middlewares (``middleware``), the router
(``routing``) and the routes (``routes``), the server's state (``state``) and metrics
(``metrics``), and the /run_code request read as the service reads it (``request``).

Needs the ``serve`` extra. May import the case path and the foundation modules; nothing
imports it but the command line.
"""
