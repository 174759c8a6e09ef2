"""The hluk process: started in a process group of its own that dies with the worker
(``spawn``, and the long-lived ``spawner`` it may use), its console's frames decoded
(``console``), and one run watched to its end under its deadlines (``process``).

May import: ``guest`` (its protocol) and the foundation modules (``errors``, ``settings``,
``outcome``, ``diagnosis``). Knows nothing of requests, responses, gates or verl.
"""
