"""The installer: `mtgpu-setup` (install, status, uninstall, bundle, WSL and OS packages).

An admin program beside the daemon, not a CLI over the API: it writes the unit, the
virtualenv and the links, so it sits at the top of the layers with `server`.
"""
