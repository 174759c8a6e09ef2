"""verl's agent-loop code tool, apart from verl: its settings, how its calls are bounded and
answered (``calls``), its notebooks, micro-VMs kept up across a trajectory's calls
(``notebook``), and the pool that keeps one per trajectory (``pool``).
``verl_hyperlight.tool`` is the verl class around it.

May import the case path, the hluk process and the foundation modules.
"""
