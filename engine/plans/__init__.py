"""The plan formats the backends read: TensorRT manifests, graph I/O specs, GPU targets and the TensorRT libraries,
and the torch backend's compiled packages."""
