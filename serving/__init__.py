"""The service's processes: the HTTP front end, the engine core that owns the GPU, and the output workers.

``serving`` is built on the media library (``streaming``: encoders, sinks, sources, output clock, frame rings), which
never imports it. Import from the submodules: each pulls in only what its process needs.
"""
