"""The case path: one Sandbox Fusion request turned into a micro-VM run and answered.

Owns which sandbox URLs are ours and what they name (``url``), what to run (the URL's image
and memory: ``guests``), the request's validation (``api``), the case's files on the host
(``casedir``), pytest's files for the guest (``pytest_library``), whether a guest is warm and
whether hluk starts it (``warmup``: the gate every run passes), and the response in Sandbox
Fusion's shape (``response``).

May import: ``hluk``, ``guest`` (its protocol), and the foundation modules (``errors``,
``settings``, ``outcome``, ``diagnosis``). Never the server, the agent tool or the commands.
"""
