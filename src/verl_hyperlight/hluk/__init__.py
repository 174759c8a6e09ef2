"""The hluk process: which hluk runs (``binary``), started in a process group of its own that
dies with the worker (``spawn``, through this process's ``spawners`` of the long-lived
``spawner`` script, with ``pipes`` sized to what they carry), its console's frames decoded
(``console``), and one run watched to its end under its deadlines (``watch``); a hluk started
ahead of its case (``ahead``) and a notebook's hluk, up between calls (``notebook``).

May import: ``guest`` (its protocol) and the foundation modules. Knows nothing of requests,
responses, gates or verl.
"""
