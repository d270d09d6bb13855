"""The HTTP server process (:mod:`hydrator.adapters.http.server`, aiohttp).

It serves files the daemon writes (:mod:`hydrator.runtime.http_endpoint`) and never imports the
daemon.
"""
