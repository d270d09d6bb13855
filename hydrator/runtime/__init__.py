"""The runtime: the command line, wiring (config -> adapters), the service loop and scheduler,
logging of cycles, metrics, and the daemon side of the HTTP endpoint. Only this package knows
every adapter; nothing below imports it (``lint-imports``).
"""
