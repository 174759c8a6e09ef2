"""The case path: one Sandbox Fusion request turned into a micro-VM run and answered.

Owns which sandbox URLs are ours and what they name (``url``), what to run (the URL's image
and memory: ``guests``), the request and its run (``api``: ``run_code``), the case's files on
the host (``casedir``), pytest's files for the guest (``pytest_library``), the gate every run
passes (``gate``: is the guest warm, does hluk start it), the warm-up a gate's probe runs
(``warmup``) against hluk's cache (``snapshots``), the micro-VMs started ahead of their cases
(``ready``), the backend failures counted and logged (``failures``), the response in Sandbox
Fusion's shape (``response``), and the Ray cluster for ``?ray`` (``cluster``).

May import: ``hluk``, ``guest`` (its protocol), and the foundation modules. Never the server,
the agent tool or the commands.
"""
