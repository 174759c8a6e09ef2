"""Code that runs inside the micro-VM, shipped as package data and sent to the guest as text."""
