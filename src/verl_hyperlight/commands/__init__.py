"""The operator's commands behind the command line: ``doctor`` (is this node ready?),
``selftest`` (does it answer as Sandbox Fusion?, against the ``conformance`` corpus) and
``bench`` (how many micro-VMs at once?).

May import everything below them; only ``verl_hyperlight.cli`` imports them.
"""
