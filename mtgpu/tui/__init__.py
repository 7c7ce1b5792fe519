"""remotegpu-cli: the terminal client that runs on users' laptops.

It knows only the API (the ``mtgpu-api`` SSH subsystem) and imports nothing of the
server's: this package, ``mtgpu/__init__.py`` and ``mtgpu/errors.py`` are what the
``remotegpu`` distribution (``clients/remotegpu``) installs.
"""
